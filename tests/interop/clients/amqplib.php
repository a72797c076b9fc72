<?php
// PHP's php-amqplib against a broker: declare, publish with confirms, consume with manual acks.
// Usage: php amqplib.php HOST PORT QUEUE; prints one line per step, "ok" last.
require_once 'PhpAmqpLib/autoload.php';

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;
use PhpAmqpLib\Wire\AMQPTable;

[, $host, $port, $queue] = $argv;
$conn = new AMQPStreamConnection($host, (int)$port, 'guest', 'guest', '/');
$props = $conn->getServerProperties();
echo "connected {$props['product'][1]}\n";
$ch = $conn->channel();
[$name, $count, $consumers] = $ch->queue_declare($queue, false, true, false, false);
echo "declared $name $count $consumers\n";
$acked = 0;
$ch->set_ack_handler(function (AMQPMessage $m) use (&$acked) { $acked++; });
$ch->confirm_select();
for ($i = 1; $i <= 3; $i++) {
    $msg = new AMQPMessage("php $i", ['content_type' => 'text/plain', 'delivery_mode' => 2,
                                      'application_headers' => new AMQPTable(['n' => $i])]);
    $ch->basic_publish($msg, '', $queue);
}
$ch->wait_for_pending_acks(10);
echo "confirmed $acked\n";
$got = 0;
$ch->basic_qos(0, 10, false);
$ch->basic_consume($queue, 'php-consumer', false, false, false, false, function (AMQPMessage $m) use (&$got) {
    $headers = $m->get('application_headers')->getNativeData();
    echo "got {$m->getBody()} {$m->get('content_type')} n={$headers['n']}\n";
    $m->ack();
    $got++;
});
while ($got < 3) {
    $ch->wait(null, false, 10);
}
$ch->basic_cancel('php-consumer');
$deleted = $ch->queue_delete($queue);
echo "deleted $deleted\n";
$ch->close();
$conn->close();
echo "ok\n";
