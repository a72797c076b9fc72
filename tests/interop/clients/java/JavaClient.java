// RabbitMQ's Java client (Debian's librabbitmq-client-java) against a broker: declare, publish
// with confirms, consume with manual acks. Usage: java JavaClient HOST PORT QUEUE; prints one
// line per step, "ok" last.
import com.rabbitmq.client.*;
import java.util.*;
import java.util.concurrent.*;

public class JavaClient {
    public static void main(String[] args) throws Exception {
        ConnectionFactory factory = new ConnectionFactory();
        factory.setHost(args[0]);
        factory.setPort(Integer.parseInt(args[1]));
        factory.setUsername("guest");
        factory.setPassword("guest");
        factory.setAutomaticRecoveryEnabled(false);
        String queue = args[2];
        try (Connection conn = factory.newConnection()) {
            System.out.println("connected " + conn.getServerProperties().get("product"));
            Channel ch = conn.createChannel();
            AMQP.Queue.DeclareOk ok = ch.queueDeclare(queue, true, false, false, null);
            System.out.println("declared " + ok.getQueue() + " " + ok.getMessageCount() + " " + ok.getConsumerCount());
            ch.confirmSelect();
            for (int i = 1; i <= 3; i++) {
                Map<String, Object> headers = new HashMap<>();
                headers.put("n", i);
                AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                    .contentType("text/plain").deliveryMode(2).headers(headers).build();
                ch.basicPublish("", queue, props, ("java " + i).getBytes("UTF-8"));
            }
            System.out.println("confirmed " + ch.waitForConfirms(10000));
            BlockingQueue<String> got = new LinkedBlockingQueue<>();
            ch.basicQos(10);
            ch.basicConsume(queue, false, "java-consumer", new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String tag, Envelope env, AMQP.BasicProperties p, byte[] body)
                        throws java.io.IOException {
                    // ack first: once the last line is taken, main cancels, deletes and closes the channel
                    getChannel().basicAck(env.getDeliveryTag(), false);
                    got.add("got " + new String(body, "UTF-8") + " " + p.getContentType() + " n=" + p.getHeaders().get("n"));
                }
            });
            for (int i = 0; i < 3; i++) {
                String line = got.poll(10, TimeUnit.SECONDS);
                if (line == null) throw new IllegalStateException("no delivery within 10 s");
                System.out.println(line);
            }
            ch.basicCancel("java-consumer");
            System.out.println("deleted " + ch.queueDelete(queue).getMessageCount());
            ch.close();
        }
        System.out.println("ok");
    }
}
