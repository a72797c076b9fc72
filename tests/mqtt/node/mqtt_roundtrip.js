// The npm `mqtt` client against exchange-broker: MQTT 3.1.1 and 5.0 round trips, retained, user
// properties and correlation data. Prints one JSON line (read by tests/mqtt/test_mqtt_node.py).
const mqtt = require("mqtt");

const url = process.argv[2];
const out = {};

function connect(opts) {
  return new Promise((resolve, reject) => {
    const c = mqtt.connect(url, { username: "guest", password: "guest", reconnectPeriod: 0, ...opts });
    c.once("connect", (connack) => resolve([c, connack]));
    c.once("error", reject);
  });
}

function nextMessage(client, n) {
  return new Promise((resolve) => {
    const got = [];
    client.on("message", (topic, payload, packet) => {
      got.push({ topic, payload: payload.toString(), qos: packet.qos, retain: packet.retain,
                 properties: packet.properties || {} });
      if (got.length === n) resolve(got);
    });
  });
}

(async () => {
  try {
    const [sub311] = await connect({ protocolVersion: 4, clientId: "node-sub-311" });
    const granted = await sub311.subscribeAsync("node/+/v311", { qos: 1 });
    out.granted = granted.map((g) => g.qos);
    const waiting311 = nextMessage(sub311, 2);
    const [pub311] = await connect({ protocolVersion: 4, clientId: "node-pub-311" });
    await pub311.publishAsync("node/a/v311", "qos1", { qos: 1 });
    await pub311.publishAsync("node/b/v311", "qos0", { qos: 0 });
    out.v311 = (await waiting311).map((m) => [m.topic, m.payload, m.qos]);
    await pub311.publishAsync("node/retained", "kept", { qos: 1, retain: true });

    const [sub5, connack5] = await connect({ protocolVersion: 5, clientId: "node-sub-5" });
    out.connack5 = { topicAliasMaximum: connack5.properties.topicAliasMaximum };
    const retained = nextMessage(sub5, 1);
    await sub5.subscribeAsync("node/retained", { qos: 1 });
    out.retained = (await retained).map((m) => [m.topic, m.payload, m.retain]);
    sub5.removeAllListeners("message");
    const waiting5 = nextMessage(sub5, 1);
    await sub5.subscribeAsync("node/v5/#", { qos: 1 });
    const [pub5] = await connect({ protocolVersion: 5, clientId: "node-pub-5" });
    await pub5.publishAsync("node/v5/x", "props", {
      qos: 1,
      properties: { userProperties: { origin: "node" }, correlationData: Buffer.from("c-7"),
                    contentType: "text/plain", responseTopic: "node/replies" } });
    const m = (await waiting5)[0];
    out.v5 = { topic: m.topic, payload: m.payload, userProperties: m.properties.userProperties,
               correlationData: m.properties.correlationData.toString(),
               contentType: m.properties.contentType, responseTopic: m.properties.responseTopic };
    for (const c of [sub311, pub311, sub5, pub5]) await c.endAsync();
  } catch (err) {
    out.error = String(err && err.stack ? err.stack : err);
  }
  console.log(JSON.stringify(out));
  process.exit(out.error ? 1 : 0);
})();
