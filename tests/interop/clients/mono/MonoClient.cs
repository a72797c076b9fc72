// Mono's RabbitMQ.Client (Debian: libmono-rabbitmq4.0-cil), the .NET client as Debian ships it.
// Its default protocol is AMQP 0-8; "AMQP_0_9" as the fourth argument picks 0-9. Prints what it
// sees, a line per step; the same lines against RabbitMQ 3.10.
// Usage: mono MonoClient.exe HOST PORT QUEUE [PROTOCOL]
using System;
using System.Collections;
using System.Text;
using RabbitMQ.Client;
using RabbitMQ.Client.Events;

class MonoClient {
    static string Text(object value) {
        return value is byte[] ? Encoding.UTF8.GetString((byte[]) value) : Convert.ToString(value);
    }

    static int Main(string[] args) {
        var factory = new ConnectionFactory();
        factory.HostName = args[0];
        factory.Port = int.Parse(args[1]);
        string queue = args[2], exchange = "x-" + args[2];
        if (args.Length > 3) factory.Protocol = Protocols.Lookup(args[3]);
        using (IConnection conn = factory.CreateConnection()) {
            Console.WriteLine("connected " + Text(conn.ServerProperties["product"]) + " " + factory.Protocol);
            IModel ch = conn.CreateModel();
            ch.ExchangeDeclare(exchange, "topic", false, false, false, false, false, null);
            Console.WriteLine("declared " + ch.QueueDeclare(queue, false, true, false, false, false, null));
            ch.QueueBind(queue, exchange, "n.*", false, null);
            ch.TxSelect();
            for (int i = 1; i <= 3; i++) {
                IBasicProperties props = ch.CreateBasicProperties();
                props.ContentType = "text/plain";
                props.DeliveryMode = 2;
                props.Headers = new Hashtable();
                props.Headers["n"] = i;
                ch.BasicPublish(exchange, "n." + i, props, Encoding.UTF8.GetBytes("mono " + i));
            }
            ch.TxCommit();
            Console.WriteLine("committed 3");
            ch.BasicQos(0, 1, false);
            var consumer = new QueueingBasicConsumer(ch);
            string tag = ch.BasicConsume(queue, false, null, consumer);
            for (int i = 1; i <= 3; i++) {
                var d = (BasicDeliverEventArgs) consumer.Queue.Dequeue();
                Console.WriteLine("got " + Encoding.UTF8.GetString(d.Body) + " " + d.BasicProperties.ContentType +
                                  " n=" + d.BasicProperties.Headers["n"] + " key=" + d.RoutingKey);
                ch.BasicAck(d.DeliveryTag, false);
                ch.TxCommit();  // the ack takes effect (and frees the prefetch window) on commit
            }
            ch.BasicCancel(tag);
            BasicGetResult none = ch.BasicGet(queue, false);
            Console.WriteLine("get " + (none == null ? "empty" : Encoding.UTF8.GetString(none.Body) + " redelivered=" + none.Redelivered));
            ch.BasicPublish(exchange, "n.4", null, Encoding.UTF8.GetBytes("again"));
            ch.TxCommit();
            BasicGetResult first = null;
            for (int i = 0; i < 50 && first == null; i++) {
                first = ch.BasicGet(queue, false);
                if (first == null) System.Threading.Thread.Sleep(100);
            }
            ch.BasicReject(first.DeliveryTag, true);
            ch.TxCommit();
            BasicGetResult second = ch.BasicGet(queue, false);
            Console.WriteLine("again " + Encoding.UTF8.GetString(second.Body) + " redelivered=" + second.Redelivered);
            ch.BasicAck(second.DeliveryTag, false);
            ch.TxCommit();
            ch.QueueUnbind(queue, exchange, "n.*", null);
            ch.BasicPublish(exchange, "n.5", null, Encoding.UTF8.GetBytes("unrouted"));
            ch.TxCommit();
            Console.WriteLine("purged " + ch.QueuePurge(queue, false));
            Console.WriteLine("deleted " + ch.QueueDelete(queue, false, false, false));
            ch.ExchangeDelete(exchange, false, false);
            ch.Close();
        }
        Console.WriteLine("ok");
        return 0;
    }
}
