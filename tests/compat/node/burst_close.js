// amqplib (callback API): publish a burst until the write buffer is full, then connection.close(cb)
// at once, as an application that sends and exits does. Against RabbitMQ cb is called without an
// error. argv: AMQP URL, number of rounds. Prints one JSON object (tests/compat/test_amqplib_close.py).
'use strict';

const path = require('path');
const amqp = require(path.join(__dirname, '..', '..', 'interop', 'node', 'node_modules', 'amqplib',
  'callback_api'));

const url = process.argv[2];
const rounds = parseInt(process.argv[3] || '1', 10);
const results = [];

function fail(what, err) {
  console.log(JSON.stringify({ error: `${what}: ${err && err.message}`, results }));
  process.exit(1);
}

function round(i) {
  if (i >= rounds) {
    console.log(JSON.stringify({ results }));
    process.exit(0);
  }
  const t0 = Date.now();
  const errors = [];
  const timer = setTimeout(() => fail(`round ${i}`, new Error('close callback never called')), 15000);
  amqp.connect(url, (err, conn) => {
    if (err) return fail('connect', err);
    conn.on('error', (e) => errors.push(`connection error: ${e.message}`));
    conn.createChannel((err2, ch) => {
      if (err2) return fail('createChannel', err2);
      ch.on('error', (e) => errors.push(`channel error: ${e.message}`));
      ch.assertQueue('', { exclusive: true }, (err3, ok) => {
        if (err3) return fail('assertQueue', err3);
        let sent = 0;
        while (sent < 100000 && ch.sendToQueue(ok.queue, Buffer.from(`message ${sent}`))) sent++;
        sent++;  // the one that returned false was queued too
        conn.close((err4) => {
          clearTimeout(timer);
          results.push({ sent, closeError: err4 ? err4.message : null, errors, ms: Date.now() - t0 });
          round(i + 1);
        });
      });
    });
  });
}

round(0);
