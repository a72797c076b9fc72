/* Super streams (partitioned streams, issue 17): the list with a form to declare one, and a super
   stream's page: its partitions, a form to raise their count, and each consumer group with its
   members and, per partition, owner, state, unacked, committed offset, next offset and lag. */
"use strict";
(() => {
  const ssPath = (vhost, name) => "/api/super-streams/" + EB.enc(vhost) + "/" + EB.enc(name);
  const ssHref = (vhost, name) => "#/super-streams/" + EB.enc(vhost) + "/" + EB.enc(name);
  const offset = (n) => (n === undefined || n === null ? "none" : EB.num(n));

  const list = async (main) => {
    main.append(EB.h("h1", {}, "Super streams"), EB.h("p", { class: "muted" },
      "Partitioned streams: exchanges of type x-super-stream, each with stream queues name-0 … name-(N-1)."));
    const box = EB.h("div", { id: "super-streams" });
    main.append(box);
    const refresh = async () => {
      const rows = await EB.get(EB.scoped("/api/super-streams"));
      EB.clear(box).append(EB.table([
        { label: "Virtual host", key: "vhost", narrow: true },
        { label: "Name", render: (s) => EB.link(ssHref(s.vhost, s.name), s.name) },
        { label: "Partitions", key: "partitions", num: true },
        { label: "Messages", key: "messages", num: true },
        { label: "Arguments", value: (s) => (Object.keys(s.arguments || {}).length ? EB.json(s.arguments) : ""), narrow: true },
      ], rows, { empty: "No super streams.", rowData: (s) => ({ superStream: s.name, vhost: s.vhost }) }));
    };
    const vhosts = await EB.vhostNames();
    main.append(EB.section("Declare a super stream", EB.form([
      { name: "vhost", label: "Virtual host", type: "select", options: vhosts, value: EB.defaultVhost() },
      { name: "name", label: "Name", required: true },
      { name: "partitions", label: "Partitions", type: "number", value: 3, min: 1 },
      { name: "arguments", label: "Arguments (JSON)", type: "textarea", wide: true,
        placeholder: '{"x-max-age": "7D", "x-max-length-bytes": 20000000000}' },
    ], async (v, form) => {
      const body = { partitions: v.partitions, arguments: EB.parseObject(v.arguments, "Arguments") };
      await EB.api("PUT", ssPath(v.vhost, v.name), body);
      EB.ok("Super stream declared: " + v.name);
      form.elements.name.value = "";
      await refresh();
    }, { submit: "Declare super stream", title: "Declare a super stream" })));
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  const partitionTable = (vhost, rows) => EB.table([
    { label: "Partition", key: "partition", num: true },
    { label: "Queue", render: (p) => (p.queue ? EB.link(EB.queueHref(vhost, p.queue), p.queue) : "missing") },
    { label: "First offset", value: (p) => offset(p.first_offset), num: true },
    { label: "Next offset", value: (p) => offset(p.next_offset), num: true },
    { label: "Messages", key: "messages", num: true },
    { label: "Bytes", value: (p) => EB.bytes(p.bytes), num: true, narrow: true },
    { label: "Consumers", key: "consumers", num: true },
  ], rows, { empty: "No partitions.", rowData: (p) => ({ partition: p.partition }) });

  /* A member's connection: its client-given name first when it has one, as on the Connections page. */
  const connLink = (name, given) => EB.link("#/connections/" + EB.enc(name), given ? given + " (" + name + ")" : name);

  const groupView = (g, given) => {
    return EB.h("section", { class: "card group", dataset: { group: g.group }, "aria-label": "Group " + g.group },
      EB.h("h2", {}, "Group " + g.group),
      EB.h("div", { class: "cards" }, EB.stat("Members", EB.num(g.members.length), "members"),
        EB.stat("Lag", EB.num(g.lag), "lag")),
      EB.h("h3", {}, "Members"),
      EB.table([
        { label: "Consumer tag", key: "consumer_tag" },
        { label: "Connection", render: (m) => (m.connection ? connLink(m.connection, given[m.connection]) : "") },
        { label: "Channel", key: "channel", num: true },
        { label: "User", key: "user", narrow: true },
        { label: "Prefetch", key: "prefetch_count", num: true },
        { label: "Partitions held", value: (m) => (m.partitions.length ? m.partitions.join(", ") : "none") },
      ], g.members, { empty: "No members: the group only keeps its stored offsets.",
        rowData: (m) => ({ member: m.consumer_tag }) }),
      EB.h("h3", {}, "Partitions"),
      EB.table([
        { label: "Partition", key: "partition", num: true },
        { label: "Owner", value: (p) => (p.owner ? p.owner : "none") },
        { label: "State", key: "state" },
        { label: "Unacked", key: "unacked", num: true },
        { label: "Committed offset", value: (p) => offset(p.committed_offset), num: true },
        { label: "Next offset", value: (p) => offset(p.next_offset), num: true },
        { label: "Lag", key: "lag", num: true },
      ], g.partitions, { rowData: (p) => ({ partition: p.partition, state: p.state }) }));
  };

  const one = async (main, vhost, name) => {
    const base = ssPath(vhost, name);
    await EB.get(base);  // not found: the router shows the API's message
    main.append(EB.h("h1", {}, "Super stream " + name), EB.h("p", { class: "muted" }, "Virtual host " + vhost + " · ",
      EB.link(EB.exchangeHref(vhost, name), "exchange " + name)));
    const totals = EB.h("div", { class: "cards", id: "super-stream-totals" });
    const partitions = EB.h("div", { id: "partitions" }), groups = EB.h("div", { id: "groups" });
    main.append(totals, EB.section("Partitions", partitions));
    const grow = EB.form([
      { name: "partitions", label: "New partition count", type: "number", min: 1, required: true },
    ], async (v) => {
      await EB.api("PUT", base, { partitions: v.partitions });
      EB.ok("Partitions of " + name + ": " + v.partitions);
      await refresh();
    }, { class: "inline", submit: "Raise partitions", title: "Raise the partition count" });
    main.append(EB.section("Raise the partition count", EB.h("p", { class: "muted" },
      "New partitions start empty and partitions are never removed. Keys then route modulo the new count: " +
      "a key that moves to another partition keeps its order there, not across the change."), grow),
      EB.h("h2", {}, "Consumer groups"), groups);

    const refresh = async () => {
      const [ss, gs] = await Promise.all([EB.get(base), EB.get(base + "/groups")]);
      const given = {};  // connection name -> the name its client gave (connection_name)
      if (gs.some((g) => g.members.length)) {
        for (const c of await EB.get("/api/vhosts/" + EB.enc(vhost) + "/connections")) given[c.name] = c.user_provided_name;
      }
      EB.clear(totals).append(EB.stat("Partitions", EB.num(ss.partitions), "partitions"),
        EB.stat("Messages", EB.num(ss.messages), "messages"), EB.stat("Groups", EB.num(gs.length), "groups"));
      EB.clear(partitions).append(partitionTable(vhost, ss.partition_details));
      const count = grow.elements.partitions;
      if (count.value === "" && document.activeElement !== count) count.value = ss.partitions + 1;
      EB.append(EB.clear(groups), [gs.length ? gs.map((g) => groupView(g, given))
        : EB.h("p", { class: "empty" }, "No consumer groups. A client joins one with basic.consume on " + name +
          " and the argument x-consumer-group.")]);
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  EB.route("super-streams", (main, parts) => (parts.length >= 2 ? one(main, parts[0], parts[1]) : list(main)));
})();
