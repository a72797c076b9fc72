/* Queues: the list, paged on the server (RabbitMQ's page / page_size / name / use_regex / sort
   parameters) so that thousands of queues stay fast, and a form to add one. */
"use strict";
(() => {
  const state = { page: 1, size: 100, name: "", regex: false, sort: "name", reverse: false };
  const COLUMNS = "name,vhost,type,state,durable,auto_delete,exclusive,arguments,policy,messages_ready," +
    "messages_unacknowledged,messages,consumers,message_stats";

  EB.route("queues", async (main, parts) => {
    if (parts.length >= 2) { await EB.queuePage(main, parts[0], parts[1]); return; }
    main.append(EB.h("h1", {}, "Queues"));
    const nameInput = EB.h("input", { type: "search", id: "queue-filter", value: state.name, placeholder: "Filter by name",
      "aria-label": "Filter queues by name" });
    const regex = EB.h("input", { type: "checkbox", id: "queue-regex", checked: state.regex });
    const size = EB.h("select", { id: "queue-page-size", "aria-label": "Queues per page" },
      [20, 100, 500].map((n) => EB.h("option", { value: n, selected: n === state.size }, n + " per page")));
    const pager = EB.h("div", { class: "pager", id: "queue-pager" });
    const box = EB.h("div", { id: "queues" });
    main.append(EB.h("div", { class: "toolbar" }, nameInput, EB.h("label", { class: "check", for: "queue-regex" }, regex, "Regex"),
      size), pager, box);

    let latest = 0;  // answers can arrive out of order (typing, paging, the timer): show the newest only
    const refresh = async () => {
      const seq = (latest += 1);
      const q = new URLSearchParams({ page: state.page, page_size: state.size, sort: state.sort,
        sort_reverse: state.reverse, columns: COLUMNS });
      if (state.name) { q.set("name", state.name); q.set("use_regex", state.regex); }
      let answer;
      try {
        answer = await EB.get(EB.scoped("/api/queues") + "?" + q);
      } catch (err) {
        if (err.status === 400 && state.page > 1 && /out of range/i.test(err.message)) {
          state.page = 1;
          return refresh();
        }
        throw err;
      }
      if (seq !== latest) return;
      const onSort = (key) => {
        state.reverse = state.sort === key ? !state.reverse : false;
        state.sort = key;
        state.page = 1;
        refresh().catch(EB.fail);
      };
      EB.clear(box).append(EB.table([
        { label: "Virtual host", key: "vhost", sort: "vhost", narrow: true },
        { label: "Name", sort: "name", render: (x) => EB.link(EB.queueHref(x.vhost, x.name), x.name) },
        { label: "Type", key: "type", sort: "type" },
        { label: "Features", render: EB.features, narrow: true },
        { label: "State", key: "state", sort: "state", narrow: true },
        { label: "Ready", key: "messages_ready", num: true, sort: "messages_ready" },
        { label: "Unacked", key: "messages_unacknowledged", num: true, sort: "messages_unacknowledged" },
        { label: "Total", key: "messages", num: true, sort: "messages" },
        { label: "Incoming", num: true, sort: "message_stats.publish_details.rate",
          value: (x) => EB.rate(EB.pick(x, "message_stats.publish_details.rate") || 0) },
        { label: "Deliver / get", num: true, sort: "message_stats.deliver_get_details.rate", narrow: true,
          value: (x) => EB.rate(EB.pick(x, "message_stats.deliver_get_details.rate") || 0) },
        { label: "Ack", num: true, sort: "message_stats.ack_details.rate", narrow: true,
          value: (x) => EB.rate(EB.pick(x, "message_stats.ack_details.rate") || 0) },
        { label: "Consumers", key: "consumers", num: true, sort: "consumers" },
      ], answer.items, { onSort, sort: state.sort, reverse: state.reverse, empty: "No queues match.",
        rowData: (x) => ({ queue: x.name, vhost: x.vhost }) }));
      const go = (page) => { state.page = page; refresh().catch(EB.fail); };
      EB.clear(pager).append(
        EB.h("button", { type: "button", disabled: answer.page <= 1, onclick: () => go(answer.page - 1) }, "‹ Previous"),
        EB.h("span", {}, `Page ${answer.page} of ${Math.max(answer.page_count, 1)} · ${EB.num(answer.filtered_count)} ` +
          `of ${EB.num(answer.total_count)} queues`),
        EB.h("button", { type: "button", disabled: answer.page >= answer.page_count, onclick: () => go(answer.page + 1) }, "Next ›"));
    };
    let typing = null;
    nameInput.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => { state.name = nameInput.value; state.page = 1; refresh().catch(EB.fail); }, 250);
    });
    regex.addEventListener("change", () => { state.regex = regex.checked; state.page = 1; refresh().catch(EB.fail); });
    size.addEventListener("change", () => { state.size = Number(size.value); state.page = 1; refresh().catch(EB.fail); });

    const vhosts = await EB.vhostNames();
    main.append(EB.section("Add a new queue", EB.form([
      { name: "vhost", label: "Virtual host", type: "select", options: vhosts, value: EB.defaultVhost() },
      { name: "type", label: "Type", type: "select", options: ["classic", "quorum", "stream"] },
      { name: "name", label: "Name", required: true },
      { name: "durable", label: "Durable", type: "checkbox", value: true },
      { name: "auto_delete", label: "Auto delete", type: "checkbox" },
      { name: "arguments", label: "Arguments (JSON)", type: "textarea", wide: true,
        placeholder: '{"x-max-length": 10000, "x-message-ttl": 60000}' },
    ], async (v, form) => {
      const args = EB.parseObject(v.arguments, "Arguments");
      if (v.type !== "classic") args["x-queue-type"] = v.type;
      await EB.api("PUT", "/api/queues/" + EB.enc(v.vhost) + "/" + EB.enc(v.name),
        { durable: v.durable, auto_delete: v.auto_delete, arguments: args });
      EB.ok("Queue declared: " + v.name);
      form.elements.name.value = "";
      await refresh();
    }, { submit: "Add queue", title: "Add a new queue" })));
    await refresh();
    EB.every(() => refresh().catch(EB.fail));
  });
})();
