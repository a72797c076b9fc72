// amqp091-go (RabbitMQ's Go client, Debian's golang-github-rabbitmq-amqp091-go-dev) against a
// broker: declare, publish with confirms, consume with manual acks.
// Usage: go run main.go URL QUEUE; prints one line per step, "ok" last.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func fail(what string, err error) {
	if err != nil {
		fmt.Printf("error %s: %v\n", what, err)
		os.Exit(1)
	}
}

func main() {
	url, queue := os.Args[1], os.Args[2]
	conn, err := amqp.Dial(url)
	fail("dial", err)
	defer conn.Close()
	fmt.Printf("connected %v\n", conn.Properties["product"])
	ch, err := conn.Channel()
	fail("channel", err)
	q, err := ch.QueueDeclare(queue, true, false, false, false, nil)
	fail("declare", err)
	fmt.Printf("declared %s %d %d\n", q.Name, q.Messages, q.Consumers)
	fail("confirm", ch.Confirm(false))
	// confirms through NotifyPublish, not PublishWithDeferredConfirm: in amqp091-go 1.5.0 (Debian's)
	// the deferred confirmation is registered after the publish is sent, so a confirm that arrives
	// first is dropped and Wait() hangs until the context ends (amqp091-go issue #182)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	acked := 0
	for i := 1; i <= 3; i++ {
		err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			ContentType: "text/plain", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"n": int32(i)}, Body: []byte(fmt.Sprintf("go %d", i))})
		fail("publish", err)
		select {
		case c := <-confirms:
			if c.Ack && c.DeliveryTag == uint64(i) {
				acked++
			}
		case <-ctx.Done():
			fail("confirm wait", ctx.Err())
		}
	}
	fmt.Printf("confirmed %d\n", acked)
	fail("qos", ch.Qos(10, 0, false))
	deliveries, err := ch.Consume(queue, "go-consumer", false, false, false, false, nil)
	fail("consume", err)
	for i := 0; i < 3; i++ {
		select {
		case d := <-deliveries:
			fmt.Printf("got %s %s n=%v\n", d.Body, d.ContentType, d.Headers["n"])
			fail("ack", d.Ack(false))
		case <-ctx.Done():
			fail("consume wait", ctx.Err())
		}
	}
	fail("cancel", ch.Cancel("go-consumer", false))
	n, err := ch.QueueDelete(queue, false, false, false)
	fail("delete", err)
	fmt.Printf("deleted %d\n", n)
	fail("close", ch.Close())
	fmt.Println("ok")
}
