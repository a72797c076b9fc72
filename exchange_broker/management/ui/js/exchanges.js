/* Exchanges: list, add, delete; an exchange's page with its rates, bindings in and out, a form
   to bind, and a form to publish a message. */
"use strict";
(() => {
  const display = (name) => name || "(AMQP default)";
  const exPath = (vhost, name) => "/api/exchanges/" + EB.enc(vhost) + "/" + EB.enc(name || "amq.default");

  const list = async (main) => {
    main.append(EB.h("h1", {}, "Exchanges"));
    const box = EB.h("div", { id: "exchanges" });
    main.append(box);
    const [vhosts, ov] = await Promise.all([EB.vhostNames(), EB.get("/api/overview")]);
    const types = ov.exchange_types.map((t) => t.name);
    main.append(EB.section("Add a new exchange", EB.form([
      { name: "vhost", label: "Virtual host", type: "select", options: vhosts, value: EB.defaultVhost() },
      { name: "name", label: "Name", required: true },
      { name: "type", label: "Type", type: "select", options: types, value: "direct" },
      { name: "durable", label: "Durable", type: "checkbox", value: true },
      { name: "auto_delete", label: "Auto delete", type: "checkbox" },
      { name: "internal", label: "Internal", type: "checkbox" },
      { name: "arguments", label: "Arguments (JSON)", type: "textarea", placeholder: '{"alternate-exchange": "unrouted"}', wide: true },
    ], async (v, form) => {
      const body = { type: v.type, durable: v.durable, auto_delete: v.auto_delete, internal: v.internal,
        arguments: EB.parseObject(v.arguments, "Arguments") };
      await EB.api("PUT", exPath(v.vhost, v.name), body);
      EB.ok("Exchange declared: " + v.name);
      form.elements.name.value = "";
      await refresh();
    }, { submit: "Add exchange", title: "Add a new exchange" })));
    const refresh = async () => {
      const rows = await EB.get(EB.scoped("/api/exchanges") + "?" + "columns=name,vhost,type,durable,auto_delete,internal,message_stats");
      EB.clear(box).append(EB.table([
        { label: "Virtual host", key: "vhost", narrow: true },
        { label: "Name", render: (x) => EB.link(EB.exchangeHref(x.vhost, x.name), display(x.name)) },
        { label: "Type", key: "type" }, { label: "Features", render: EB.features },
        { label: "Rate in", value: (x) => EB.rate(EB.pick(x, "message_stats.publish_in_details.rate") || 0), num: true },
        { label: "Rate out", value: (x) => EB.rate(EB.pick(x, "message_stats.publish_out_details.rate") || 0), num: true },
      ], rows, { rowData: (x) => ({ exchange: x.name }) }));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  EB.bindingTable = (rows, opts) => EB.table([
    { label: opts.otherLabel, render: (b) => {
      const other = b[opts.otherKey];
      const type = opts.otherKey === "source" ? "exchange" : b.destination_type;
      return EB.link(type === "queue" ? EB.queueHref(b.vhost, other) : EB.exchangeHref(b.vhost, other),
        (type === "queue" ? "queue " : "exchange ") + display(other));
    } },
    { label: "Routing key", key: "routing_key" },
    { label: "Arguments", value: (b) => (Object.keys(b.arguments || {}).length ? EB.json(b.arguments) : "") },
    { label: "", render: (b) => (b.source === "" ? "" : EB.confirmButton("Unbind", "Remove this binding?", async () => {
      const kind = b.destination_type === "queue" ? "q" : "e";
      await EB.api("DELETE", "/api/bindings/" + EB.enc(b.vhost) + "/e/" + EB.enc(b.source) + "/" + kind + "/" +
        EB.enc(b.destination) + "/" + EB.enc(b.properties_key));
      EB.ok("Binding removed");
      await opts.refresh();
    })) },
  ], rows, { empty: opts.empty });

  const one = async (main, vhost, name) => {
    const x = await EB.get(exPath(vhost, name));
    main.append(EB.h("h1", {}, "Exchange " + display(x.name)), EB.h("p", { class: "muted" }, "Virtual host " + vhost));
    const details = EB.h("div"), chart = EB.h("div", { class: "charts" }), out = EB.h("div"), inc = EB.h("div");
    main.append(EB.section("Details", details), chart, EB.section("Bindings from this exchange", out),
      EB.section("Bindings to this exchange", inc));
    const refresh = async () => {
      const [ex, src, dst] = await Promise.all([EB.get(exPath(vhost, name) + "?" + EB.sampleQuery(["msg_rates"])),
        EB.get(exPath(vhost, name) + "/bindings/source"), EB.get(exPath(vhost, name) + "/bindings/destination")]);
      EB.clear(details).append(EB.kv([["Type", ex.type], ["Features", EB.features(ex)],
        ["Arguments", Object.keys(ex.arguments || {}).length ? EB.json(ex.arguments) : "none"]]));
      EB.clear(chart).append(EB.chart("Message rates", EB.rateSeries(ex.message_stats,
        [["publish_in", "in"], ["publish_out", "out"]]), { id: "chart-exchange-rates" }));
      EB.clear(out).append(EB.bindingTable(src, { otherLabel: "To", otherKey: "destination", refresh, empty: "No bindings." }));
      EB.clear(inc).append(EB.bindingTable(dst, { otherLabel: "From", otherKey: "source", refresh, empty: "No bindings." }));
    };
    if (x.name) {
      main.append(EB.section("Add a binding from this exchange", EB.form([
        { name: "dtype", label: "To", type: "select", options: [["q", "queue"], ["e", "exchange"]] },
        { name: "destination", label: "Name", required: true },
        { name: "routing_key", label: "Routing key" },
        { name: "arguments", label: "Arguments (JSON)", type: "textarea", wide: true },
      ], async (v) => {
        await EB.api("POST", "/api/bindings/" + EB.enc(vhost) + "/e/" + EB.enc(name) + "/" + v.dtype + "/" + EB.enc(v.destination),
          { routing_key: v.routing_key, arguments: EB.parseObject(v.arguments, "Arguments") });
        EB.ok("Bound to " + v.destination);
        await refresh();
      }, { submit: "Bind", title: "Add a binding" })));
    }
    const result = EB.h("p", { id: "publish-result", role: "status" });
    main.append(EB.section("Publish message", EB.form([
      { name: "routing_key", label: "Routing key" },
      { name: "delivery_mode", label: "Delivery mode", type: "select", options: [["1", "1 - non-persistent"], ["2", "2 - persistent"]] },
      { name: "headers", label: "Headers (JSON)", type: "textarea", placeholder: '{"x-trace": "abc"}' },
      { name: "properties", label: "Properties (JSON)", type: "textarea", placeholder: '{"content_type": "text/plain", "priority": 1}' },
      { name: "payload", label: "Payload", type: "textarea", wide: true },
    ], async (v) => {
      const props = EB.parseObject(v.properties, "Properties");
      props.delivery_mode = Number(v.delivery_mode);
      const headers = EB.parseObject(v.headers, "Headers");
      if (Object.keys(headers).length) props.headers = headers;
      const answer = await EB.api("POST", exPath(vhost, name) + "/publish",
        { routing_key: v.routing_key, payload: v.payload, payload_encoding: "string", properties: props });
      result.textContent = answer.routed ? "Message published." : "Message published, but not routed.";
      EB.ok(result.textContent);
    }, { submit: "Publish message", title: "Publish message" }), result));
    if (x.name && !x.name.startsWith("amq.")) {
      main.append(EB.section("Delete this exchange", EB.confirmButton("Delete", "Delete exchange " + x.name + "?", async () => {
        await EB.api("DELETE", exPath(vhost, name));
        EB.ok("Exchange deleted: " + x.name);
        EB.go("#/exchanges");
      })));
    }
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  EB.route("exchanges", (main, parts) => (parts.length >= 2 ? one(main, parts[0], parts[1] === "amq.default" ? "" : parts[1]) : list(main)));
})();
