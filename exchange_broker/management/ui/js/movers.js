/* Shovels and federation links: state (with the reason when an end refuses), the node running
   it, messages moved and the rate since the last refresh; restart or delete a shovel. Declared
   through the HTTP API or `exchange-broker admin shovel declare` (RabbitMQ's shovel parameters). */
"use strict";
(() => {
  const last = {};  // id -> [forwarded, time]: rates from the counters between refreshes
  const rateOf = (id, forwarded) => {
    const now = Date.now(), prev = last[id];
    last[id] = [forwarded, now];
    return prev && now > prev[1] ? Math.max(0, (forwarded - prev[0]) * 1000 / (now - prev[1])) : 0;
  };
  const state = (s) => EB.h("span", { class: "tag state-" + s }, s);
  const shovelPath = (s) => EB.enc(s.vhost) + "/" + EB.enc(s.name);

  EB.route("shovels", async (main) => {
    main.append(EB.h("h1", {}, "Shovels and federation"));
    const shovels = EB.h("div", { id: "shovels" }), links = EB.h("div", { id: "federation-links" });
    main.append(EB.section("Shovels", shovels), EB.section("Federation links", links));
    const act = async (what, fn) => {
      try { await fn(); EB.ok(what); await refresh(); } catch (err) { EB.fail(err); }
    };
    const refresh = async () => {
      const [ss, ls] = await Promise.all([EB.get(EB.scoped("/api/shovels")), EB.get(EB.scoped("/api/federation-links"))]);
      EB.clear(shovels).append(EB.table([
        { label: "Name", key: "name" }, { label: "Virtual host", key: "vhost", narrow: true },
        { label: "State", render: (s) => state(s.state) }, { label: "Node", key: "node", narrow: true },
        { label: "Source", value: (s) => s.src_uri + " " + (s.src_queue || s.src_exchange || "") },
        { label: "Destination", value: (s) => s.dest_uri + " " + (s.dest_queue || s.dest_exchange || "") },
        { label: "Moved", key: "forwarded", num: true },
        { label: "Rate", value: (s) => EB.rate(rateOf("s/" + s.vhost + "/" + s.name, s.forwarded)), num: true },
        { label: "Reason", value: (s) => s.reason || "" },
        { label: "", render: (s) => EB.h("span", {},
          EB.h("button", { type: "button", class: "restart", onclick: () => act("Shovel restarted: " + s.name,
            () => EB.api("DELETE", "/api/shovels/vhost/" + shovelPath(s) + "/restart")) }, "Restart"),
          " ",
          EB.h("button", { type: "button", class: "delete", onclick: () => act("Shovel deleted: " + s.name,
            () => EB.api("DELETE", "/api/parameters/shovel/" + shovelPath(s))) }, "Delete")) },
      ], ss, { empty: "No shovels.", rowData: (s) => ({ shovel: s.name }) }));
      EB.clear(links).append(EB.table([
        { label: "Link", key: "id" }, { label: "Virtual host", key: "vhost", narrow: true },
        { label: "Type", key: "type" }, { label: "Upstream", value: (l) => l.upstream + " (" + l.uri + ")" },
        { label: "Status", render: (l) => state(l.status) }, { label: "Node", key: "node", narrow: true },
        { label: "Moved", key: "forwarded", num: true },
        { label: "Rate", value: (l) => EB.rate(rateOf("f/" + l.vhost + "/" + l.id, l.forwarded)), num: true },
        { label: "Dropped", key: "dropped", num: true, narrow: true },
        { label: "Error", value: (l) => l.error || "" },
      ], ls, { empty: "No federation links.", rowData: (l) => ({ link: l.id }) }));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  });
})();
