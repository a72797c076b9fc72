/* Connections (with a page per connection: client properties, channels, close with a reason)
   and channels. */
"use strict";
(() => {
  const client = (c) => {
    const cp = c.client_properties || {};
    return [cp.product, cp.version].filter(Boolean).join(" ") || cp.platform || "";
  };
  const connHref = (name) => "#/connections/" + EB.enc(name);

  const list = async (main) => {
    main.append(EB.h("h1", {}, "Connections"));
    const box = EB.h("div", { id: "connections" });
    main.append(box);
    const refresh = async () => {
      const scope = EB.vhost() ? "/api/vhosts/" + EB.enc(EB.vhost()) : "/api";
      const [conns, chans] = await Promise.all([EB.get(scope + "/connections"), EB.get(scope + "/channels")]);
      const rates = {};  // a connection's rates: the sum of its channels'
      for (const c of chans) {
        const r = rates[c.connection_details.name] || (rates[c.connection_details.name] = { publish: 0, deliver: 0 });
        r.publish += EB.pick(c, "message_stats.publish_details.rate") || 0;
        r.deliver += EB.pick(c, "message_stats.deliver_details.rate") || 0;
      }
      const rate = (c, key) => EB.rate((rates[c.name] || {})[key] || 0);
      EB.clear(box).append(EB.table([
        { label: "Name", render: (c) => EB.link(connHref(c.name), c.user_provided_name ? c.user_provided_name + " (" + c.name + ")" : c.name) },
        { label: "Virtual host", key: "vhost" }, { label: "User", key: "user" }, { label: "State", key: "state" },
        { label: "Client", value: client, narrow: true }, { label: "Channels", key: "channels", num: true },
        { label: "Heartbeat", render: (c) => c.timeout + " s", narrow: true },
        { label: "Publish", value: (c) => rate(c, "publish"), num: true },
        { label: "Deliver", value: (c) => rate(c, "deliver"), num: true },
      ], conns, { empty: "No connections.", rowData: (c) => ({ connection: c.user_provided_name || c.name }) }));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  const one = async (main, name) => {
    main.append(EB.h("h1", {}, "Connection " + name));
    const info = EB.h("div"), chans = EB.h("div");
    main.append(EB.section("Details", info), EB.section("Channels", chans));
    const closeForm = EB.form([{ name: "reason", label: "Reason", value: "Closed via management UI", wide: true }],
      async (v) => {  // the reason travels in the X-Reason header, as RabbitMQ's UI sends it
        await EB.api("DELETE", "/api/connections/" + EB.enc(name), undefined, undefined, { "X-Reason": v.reason });
        EB.ok("Connection closed: " + name);
        EB.go("#/connections");
      }, { submit: "Close connection", title: "Close connection" });
    main.append(EB.section("Close this connection", closeForm));
    const refresh = async () => {
      const c = await EB.get("/api/connections/" + EB.enc(name));
      const cp = c.client_properties || {};
      EB.clear(info).append(EB.kv([["User", c.user], ["Virtual host", c.vhost], ["State", c.state],
        ["Peer", c.peer_host + ":" + c.peer_port], ["Protocol", c.protocol], ["Heartbeat", c.timeout + " s"],
        ["Frame max", EB.num(c.frame_max)], ["Channel max", EB.num(c.channel_max)],
        ["Client properties", EB.h("pre", { class: "payload" }, JSON.stringify(cp, null, 1))]]));
      EB.clear(chans).append(channelTable(await EB.get("/api/connections/" + EB.enc(name) + "/channels")));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  };

  const channelTable = (chans) => EB.table([
    { label: "Channel", key: "name" }, { label: "User", key: "user", narrow: true },
    { label: "Mode", value: (c) => [c.confirm ? "confirm" : null, c.transactional ? "tx" : null].filter(Boolean).join(", ") },
    { label: "State", key: "state" }, { label: "Prefetch", key: "prefetch_count", num: true },
    { label: "Unacked", key: "messages_unacknowledged", num: true },
    { label: "Unconfirmed", key: "messages_unconfirmed", num: true, narrow: true },
    { label: "Consumers", key: "consumer_count", num: true },
    { label: "Publish", value: (c) => EB.rate(EB.pick(c, "message_stats.publish_details.rate")), num: true },
    { label: "Deliver", value: (c) => EB.rate(EB.pick(c, "message_stats.deliver_details.rate")), num: true },
    { label: "Ack", value: (c) => EB.rate(EB.pick(c, "message_stats.ack_details.rate")), num: true },
  ], chans, { empty: "No channels." });

  EB.route("connections", (main, parts) => (parts.length ? one(main, parts[0]) : list(main)));
  EB.route("channels", async (main) => {
    main.append(EB.h("h1", {}, "Channels"));
    const box = EB.h("div", { id: "channels" });
    main.append(box);
    const refresh = async () => {
      const path = EB.vhost() ? "/api/vhosts/" + EB.enc(EB.vhost()) + "/channels" : "/api/channels";
      EB.clear(box).append(channelTable(await EB.get(path)));
    };
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  });
})();
