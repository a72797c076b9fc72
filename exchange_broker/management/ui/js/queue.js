/* One queue: details, charts of its lengths and rates, consumers, bindings, policy, stream
   offsets (stream queues), get messages, move messages, purge, delete. */
"use strict";
(() => {
  const RATES = [["publish", "publish"], ["deliver_get", "deliver / get"], ["ack", "ack"], ["redeliver", "redeliver"]];

  const messageView = (m, i) => EB.h("div", { class: "card message", dataset: { index: i } },
    EB.kv([["Exchange", m.exchange || "(AMQP default)"], ["Routing key", m.routing_key],
      ["Redelivered", String(m.redelivered)], ["Properties", EB.json(m.properties)],
      ["Payload", EB.h("span", {}, EB.num(m.payload_bytes) + " bytes, encoding " + m.payload_encoding,
        EB.h("pre", { class: "payload" }, m.payload))]]));

  EB.queuePage = async (main, vhost, name) => {
    const base = "/api/queues/" + EB.enc(vhost) + "/" + EB.enc(name);
    const first = await EB.get(base);
    const stream = first.type === "stream";
    main.append(EB.h("h1", {}, "Queue " + name), EB.h("p", { class: "muted" }, "Virtual host " + vhost + " · " + first.type));
    const totals = EB.h("div", { class: "cards", id: "queue-totals" });
    const details = EB.h("div"), charts = EB.h("div", { class: "charts" }), consumers = EB.h("div"), bindings = EB.h("div");
    const streamBox = EB.h("div");
    EB.append(main, [totals, charts, EB.section("Details", details), stream ? EB.section("Stream", streamBox) : null,
      EB.section("Consumers", consumers), EB.section("Bindings", bindings)]);

    const refresh = async () => {
      const [q, binds] = await Promise.all([EB.get(base + "?" + EB.sampleQuery(["lengths", "msg_rates"])),
        EB.get(base + "/bindings")]);
      EB.clear(totals).append(EB.stat("Ready", EB.num(q.messages_ready), "ready"),
        EB.stat("Unacked", EB.num(q.messages_unacknowledged), "unacked"), EB.stat("Total", EB.num(q.messages), "total"),
        EB.stat("Consumers", EB.num(q.consumers), "consumers"), EB.stat("Bytes", EB.bytes(q.message_bytes), "bytes"));
      EB.clear(charts).append(EB.chart("Queued messages", EB.lengthSeries(q), { id: "chart-queue-lengths" }),
        EB.chart("Message rates", EB.rateSeries(q.message_stats, RATES), { id: "chart-queue-rates" }));
      const policyDef = q.effective_policy_definition || {};
      EB.clear(details).append(EB.kv([["Type", q.type], ["State", q.state], ["Features", EB.features(q)],
        ["Arguments", Object.keys(q.arguments || {}).length ? EB.json(q.arguments) : "none"],
        ["Policy", q.policy || "none"], ["Operator policy", q.operator_policy || "none"],
        ["Effective policy definition", Object.keys(policyDef).length ? EB.json(policyDef) : "none"],
        q.owner_pid_details ? ["Exclusive owner", q.owner_pid_details.name] : null]));
      EB.clear(consumers).append(EB.table([
        { label: "Channel", render: (c) => EB.link("#/connections/" + EB.enc(c.channel_details.connection_name), c.channel_details.name) },
        { label: "Consumer tag", key: "consumer_tag" }, { label: "Ack required", value: (c) => String(c.ack_required) },
        { label: "Exclusive", value: (c) => String(c.exclusive), narrow: true },
        { label: "Prefetch", key: "prefetch_count", num: true }, { label: "Active", value: (c) => c.activity_status },
        { label: "Arguments", value: (c) => (Object.keys(c.arguments || {}).length ? EB.json(c.arguments) : ""), narrow: true },
      ], q.consumer_details, { empty: "No consumers." }));
      EB.clear(bindings).append(EB.bindingTable(binds, { otherLabel: "From", otherKey: "source", refresh, empty: "No bindings." }));
      if (stream) {
        const s = await EB.get("/api/stream-offsets/" + EB.enc(vhost) + "/" + EB.enc(name));
        EB.clear(streamBox).append(EB.kv([["First offset", EB.num(s.first_offset)], ["Next offset", EB.num(s.next_offset)],
          ["Last offset", s.last_offset === null ? "none" : EB.num(s.last_offset)], ["Messages", EB.num(s.messages)],
          ["Bytes", EB.bytes(s.bytes)], ["Segments", EB.num(s.segments)], ["Readers", EB.num(s.consumers)]]),
        EB.h("h2", {}, "Named consumers' offsets"),
        EB.table([{ label: "Consumer name", value: (r) => r[0] }, { label: "Stored offset", value: (r) => r[1], num: true }],
          Object.entries(s.offsets || {}), { empty: "No stored offsets.", rowData: (r) => ({ consumer: r[0] }) }));
      }
    };

    main.append(EB.section("Add a binding to this queue", EB.form([
      { name: "source", label: "From exchange", required: true },
      { name: "routing_key", label: "Routing key" },
      { name: "arguments", label: "Arguments (JSON)", type: "textarea", wide: true },
    ], async (v) => {
      await EB.api("POST", "/api/bindings/" + EB.enc(vhost) + "/e/" + EB.enc(v.source) + "/q/" + EB.enc(name),
        { routing_key: v.routing_key, arguments: EB.parseObject(v.arguments, "Arguments") });
      EB.ok("Bound from " + v.source);
      await refresh();
    }, { submit: "Bind", title: "Add a binding" })));

    if (!stream) {
      const got = EB.h("div", { id: "got-messages" });
      main.append(EB.section("Get messages", EB.h("p", { class: "muted" },
        "Getting messages is destructive with the ack modes that do not requeue."), EB.form([
        { name: "ackmode", label: "Ack mode", type: "select", options: [["ack_requeue_true", "Nack message, requeue true"],
          ["ack_requeue_false", "Automatic ack"], ["reject_requeue_true", "Reject, requeue true"],
          ["reject_requeue_false", "Reject, requeue false"]] },
        { name: "encoding", label: "Encoding", type: "select", options: [["auto", "Auto string / base64"], ["base64", "base64"]] },
        { name: "count", label: "Messages", type: "number", value: 1, min: 1 },
        { name: "truncate", label: "Truncate payload to (bytes)", type: "number", value: 50000, min: 0 },
      ], async (v) => {
        const msgs = await EB.api("POST", base + "/get", { count: v.count || 1, ackmode: v.ackmode, encoding: v.encoding,
          truncate: v.truncate });
        EB.append(EB.clear(got), [msgs.length ? msgs.map(messageView) : EB.h("p", { class: "empty" }, "Queue is empty")]);
        await refresh();
      }, { submit: "Get messages", title: "Get messages" }), got));

      main.append(EB.section("Move messages", EB.h("p", { class: "muted" },
        "Moves the ready messages to another queue of this virtual host."), EB.form([
        { name: "destination", label: "Destination queue", required: true },
      ], async (v) => {
        const answer = await EB.api("POST", base + "/move", { destination: v.destination });
        EB.ok("Moved " + answer.moved + " messages to " + v.destination);
        await refresh();
      }, { submit: "Move messages", title: "Move messages" })));

      main.append(EB.section("Purge", EB.confirmButton("Purge", "Remove every ready message from " + name + "?", async () => {
        await EB.api("DELETE", base + "/contents");
        EB.ok("Queue purged: " + name);
        await refresh();
      }, { ariaLabel: "Purge messages" })));
    }
    main.append(EB.section("Delete", EB.confirmButton("Delete", "Delete queue " + name + "?", async () => {
      await EB.api("DELETE", base);
      EB.ok("Queue deleted: " + name);
      EB.go("#/queues");
    }, { ariaLabel: "Delete queue" })));
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };
})();
