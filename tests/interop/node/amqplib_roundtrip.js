// amqplib (the Node.js AMQP 0-9-1 client) round trip against an AMQP URL given as argv[2].
// Prints one JSON object on stdout; tests/interop/test_amqplib_node.py checks it.
'use strict';

const amqp = require('amqplib');

const url = process.argv[2];
if (!url) {
  console.error('usage: node amqplib_roundtrip.js amqp://guest:guest@127.0.0.1:PORT/');
  process.exit(2);
}

function deadline(ms, what) {
  return new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), ms).unref());
}

// Resolve once `count` messages went through `onMessage` (consumer started on `queue`).
async function consumeN(ch, queue, count, onMessage, options) {
  const got = [];
  let consumerTag;
  await Promise.race([
    new Promise((resolve, reject) => {
      ch.consume(queue, (msg) => {
        try {
          if (msg === null) return reject(new Error('consumer cancelled by the server'));
          got.push(onMessage(msg));
          if (got.length === count) resolve();
        } catch (err) {
          reject(err);
        }
      }, options).then((ok) => { consumerTag = ok.consumerTag; }, reject);
    }),
    deadline(5000, `${count} messages from ${queue}`),
  ]);
  await ch.cancel(consumerTag);
  return { consumerTag, got };
}

async function main() {
  const out = {};
  const conn = await amqp.connect(url);
  out.server_product = conn.connection.serverProperties.product;
  conn.on('error', (err) => { out.connection_error = String(err); });

  // -- a durable queue, persistent messages through a confirm channel -------------------------
  const pub = await conn.createConfirmChannel();
  const declared = await pub.assertQueue('node_tasks', { durable: true });
  out.assert_queue = { queue: declared.queue, messageCount: declared.messageCount,
                       consumerCount: declared.consumerCount };
  const confirmed = [];
  for (let i = 0; i < 5; i++) {
    pub.sendToQueue('node_tasks', Buffer.from(`task ${i}`), {
      persistent: true,
      contentType: 'text/plain',
      correlationId: `c${i}`,
      headers: { index: i, tag: 'node', nested: { ok: true } },
    }, (err) => { confirmed.push(err ? `nack ${i}` : `ack ${i}`); });
  }
  await pub.waitForConfirms();
  out.confirms = confirmed;
  out.check_queue = (await pub.checkQueue('node_tasks')).messageCount;

  // -- consume + ack on a second channel with a prefetch window ------------------------------
  const sub = await conn.createChannel();
  await sub.prefetch(2);
  const consumed = await consumeN(sub, 'node_tasks', 5, (msg) => {
    sub.ack(msg);
    return {
      body: msg.content.toString(),
      redelivered: msg.fields.redelivered,
      deliveryTag: msg.fields.deliveryTag,
      deliveryMode: msg.properties.deliveryMode,
      contentType: msg.properties.contentType,
      correlationId: msg.properties.correlationId,
      headers: msg.properties.headers,
    };
  }, { noAck: false });
  out.consumed = consumed.got;
  out.consumer_tag_prefix = consumed.consumerTag.slice(0, 9);
  out.after_consume = (await sub.checkQueue('node_tasks')).messageCount;

  // -- topic exchange, server-named exclusive queue, exchange-to-exchange binding ------------
  await pub.assertExchange('node_topic', 'topic', { durable: false });
  await pub.assertExchange('node_fanout', 'fanout', { durable: false });
  const q = (await pub.assertQueue('', { exclusive: true })).queue;
  out.server_named = q.startsWith('amq.gen-');
  await pub.bindQueue(q, 'node_topic', 'orders.*');
  await pub.bindExchange('node_fanout', 'node_topic', 'audit.#');  // destination, source, pattern
  await pub.bindQueue(q, 'node_fanout', '');
  const returned = [];
  pub.on('return', (msg) => {
    returned.push({ body: msg.content.toString(), replyCode: msg.fields.replyCode,
                    replyText: msg.fields.replyText, routingKey: msg.fields.routingKey });
  });
  const published = [
    ['orders.created', 'order 1'],
    ['orders.created.eu', 'too deep'],   // unroutable: returned (mandatory)
    ['audit.login.ok', 'via e2e'],       // node_topic -> node_fanout -> q
    ['orders.paid', 'order 1 paid'],
  ];
  for (const [key, body] of published) {
    pub.publish('node_topic', key, Buffer.from(body), { mandatory: true });
  }
  await pub.waitForConfirms();
  const routed = await consumeN(sub, q, 3, (msg) => {
    sub.ack(msg);
    return [msg.fields.exchange, msg.fields.routingKey, msg.content.toString()];
  }, { noAck: false });
  out.routed = routed.got;
  out.returned = returned;

  // -- basic.get, nack with requeue, redelivery ----------------------------------------------
  pub.publish('node_topic', 'orders.shipped', Buffer.from('shipped'));
  await pub.waitForConfirms();
  const first = await sub.get(q, { noAck: false });
  out.get_first = first && { body: first.content.toString(), redelivered: first.fields.redelivered,
                             messageCount: first.fields.messageCount };
  sub.nack(first, false, true);
  const again = await sub.get(q, { noAck: false });
  out.get_again = again && { body: again.content.toString(), redelivered: again.fields.redelivered };
  sub.ack(again);
  out.get_empty = await sub.get(q);

  // -- unbind, delete ------------------------------------------------------------------------
  await pub.unbindQueue(q, 'node_topic', 'orders.*');
  pub.publish('node_topic', 'orders.created', Buffer.from('after unbind'), { mandatory: true });
  await pub.waitForConfirms();
  await new Promise((r) => setTimeout(r, 50));  // a basic.return precedes the ack; let it land
  out.returned_after_unbind = returned.length;
  out.delete_queue = (await pub.deleteQueue('node_tasks')).messageCount;
  await pub.deleteExchange('node_fanout');
  await pub.deleteExchange('node_topic');

  await pub.close();
  await sub.close();
  await conn.close();
  return out;
}

main().then((out) => {
  process.stdout.write(JSON.stringify(out) + '\n');
}, (err) => {
  process.stdout.write(JSON.stringify({ error: String(err && err.stack || err) }) + '\n');
  process.exitCode = 1;
});
