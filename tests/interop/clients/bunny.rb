# Ruby's Bunny against a broker: declare, publish with confirms, consume with manual acks.
# Usage: ruby bunny.rb HOST PORT QUEUE; prints one line per step, "ok" last.
require "bunny"

host, port, queue_name = ARGV
$stdout.sync = true
conn = Bunny.new(host: host, port: port.to_i, user: "guest", password: "guest", vhost: "/",
                 heartbeat: 0, connection_timeout: 10, automatically_recover: false)
conn.start
puts "connected #{conn.server_properties["product"]}"
ch = conn.create_channel
q = ch.queue(queue_name, durable: true)
puts "declared #{q.name}"
ch.confirm_select
3.times { |i| ch.default_exchange.publish("ruby #{i + 1}", routing_key: q.name, persistent: true,
                                          content_type: "text/plain", headers: { "n" => i + 1 }) }
puts "confirmed #{ch.wait_for_confirms}"
got = Queue.new
q.subscribe(manual_ack: true) do |delivery, props, body|
  # ack first: once the last line is taken, the main thread counts, deletes and closes; the ack and
  # the count's queue.declare go on the same channel, so the count comes after every ack
  ch.ack(delivery.delivery_tag)
  got << "got #{body} #{props.content_type} n=#{props.headers["n"]} redelivered=#{delivery.redelivered?}"
end
3.times { puts got.pop }
puts "left #{q.message_count}"
q.delete
conn.close
puts "ok"
