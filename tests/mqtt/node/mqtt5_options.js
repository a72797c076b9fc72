// The npm `mqtt` client (MQTT 5) against exchange-broker: topic aliases the broker assigns (the
// client allows 4), no-local and retain-as-published subscription options. Prints one JSON line
// (read by tests/mqtt/test_mqtt5_options_aliases.py).
const mqtt = require("mqtt");

const url = process.argv[2];
const out = {};

function connect(opts) {
  return new Promise((resolve, reject) => {
    const c = mqtt.connect(url, { username: "guest", password: "guest", reconnectPeriod: 0,
                                  protocolVersion: 5, ...opts });
    c.once("connect", (connack) => resolve([c, connack]));
    c.once("error", reject);
  });
}

function collect(client, n) {
  return new Promise((resolve) => {
    const got = [];
    client.on("message", (topic, payload, packet) => {
      got.push({ topic, payload: payload.toString(), retain: packet.retain,
                 alias: (packet.properties || {}).topicAlias || null });
      if (got.length === n) resolve(got.slice());
    });
  });
}

(async () => {
  try {
    const [sub] = await connect({ clientId: "node-alias-sub", properties: { topicAliasMaximum: 4 } });
    await sub.subscribeAsync("na/#", { qos: 1, nl: true, rap: true });
    const waiting = collect(sub, 4);
    await sub.publishAsync("na/own", "own", { qos: 1 });  // no-local: never comes back
    const [pub] = await connect({ clientId: "node-alias-pub" });
    await pub.publishAsync("na/long/topic/name", "kept", { qos: 1, retain: true });
    await pub.publishAsync("na/long/topic/name", "m2", { qos: 1 });
    await pub.publishAsync("na/long/topic/name", "m3", { qos: 1 });
    await pub.publishAsync("na/other", "m4", { qos: 1 });
    out.got = await waiting;
    await pub.publishAsync("na/long/topic/name", "", { qos: 1, retain: true });  // clear it
    for (const c of [sub, pub]) await c.endAsync();
  } catch (err) {
    out.error = String(err && err.stack ? err.stack : err);
  }
  console.log(JSON.stringify(out));
  process.exit(out.error ? 1 : 0);
})();
