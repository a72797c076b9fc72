/* Overview: totals, queued-messages and message-rate charts (10 minutes, refreshed every sample
   interval), this node's memory, file descriptors, alarms and listeners. */
"use strict";
(() => {
  const RATES = [["publish", "publish"], ["confirm", "confirm"], ["deliver_get", "deliver / get"],
    ["ack", "ack"], ["redeliver", "redeliver"], ["return_unroutable", "return"]];

  EB.rateSeries = (stats, keys) => keys.map(([key, name]) => ({
    name, key, points: EB.ratesFrom((stats || {})[key + "_details"]),
    current: EB.pick(stats || {}, key + "_details.rate") || 0, format: EB.rate,
  }));
  EB.lengthSeries = (obj) => [["messages_ready", "ready"], ["messages_unacknowledged", "unacked"], ["messages", "total"]]
    .map(([key, name]) => ({ name, key, points: EB.pointsFrom(obj[key + "_details"]), current: obj[key] || 0 }));

  const nodeRows = (nodes) => EB.table([
    { label: "Node", key: "name" },
    { label: "Memory", render: (n) => EB.bytes(n.mem_used) + (n.mem_limit ? " of " + EB.bytes(n.mem_limit) : "") },
    { label: "File descriptors", render: (n) => EB.num(n.fd_used) + (n.fd_total ? " of " + EB.num(n.fd_total) : "") },
    { label: "Sockets", key: "sockets_used", num: true },
    { label: "Disk free", render: (n) => (n.disk_free ? EB.bytes(n.disk_free) + " (limit " + EB.bytes(n.disk_free_limit) + ")" : "n/a"), narrow: true },
    { label: "Alarms", render: (n) => (n.alarms && n.alarms.length
      ? n.alarms.map((a) => EB.h("span", { class: "tag", style: "color:var(--err)", title: a.detail }, a.resource + " alarm"))
      : "none") },
    { label: "Uptime", render: (n) => EB.duration(n.uptime), narrow: true },
  ], nodes, { rowData: (n) => ({ node: n.name }) });

  EB.route("overview", async (main) => {
    main.append(EB.h("h1", {}, "Overview"));
    const totals = EB.h("div", { class: "cards", id: "totals" });
    const charts = EB.h("div", { class: "charts" });
    const nodes = EB.section("Nodes");
    const listeners = EB.section("Listeners");
    main.append(totals, charts, nodes, listeners);
    const refresh = async () => {
      const [ov, nodeList] = await Promise.all([
        EB.get("/api/overview?" + EB.sampleQuery(["lengths", "msg_rates"])), EB.get("/api/nodes")]);
      const o = ov.object_totals, q = ov.queue_totals;
      EB.clear(totals).append(EB.stat("Connections", EB.num(o.connections), "connections"),
        EB.stat("Channels", EB.num(o.channels), "channels"), EB.stat("Exchanges", EB.num(o.exchanges), "exchanges"),
        EB.stat("Queues", EB.num(o.queues), "queues"), EB.stat("Consumers", EB.num(o.consumers), "consumers"),
        EB.stat("Ready", EB.num(q.messages_ready), "ready"), EB.stat("Unacked", EB.num(q.messages_unacknowledged), "unacked"),
        EB.stat("Total messages", EB.num(q.messages), "messages"));
      EB.clear(charts).append(
        EB.chart("Queued messages", EB.lengthSeries(q), { id: "chart-queued" }),
        EB.chart("Message rates", EB.rateSeries(ov.message_stats, RATES), { id: "chart-rates" }));
      EB.clear(nodes).append(EB.h("h2", {}, "Nodes"), nodeRows(nodeList),
        EB.h("p", { class: "muted" }, ov.product_name + " " + ov.product_version + " · RabbitMQ management API " +
          ov.management_version + " · cluster " + ov.cluster_name));
      EB.clear(listeners).append(EB.h("h2", {}, "Listeners"), EB.table([
        { label: "Protocol", key: "protocol" }, { label: "Address", key: "ip_address" }, { label: "Port", key: "port", num: true },
      ], ov.listeners));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  });
})();
