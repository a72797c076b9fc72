/* Admin: users, virtual hosts, permissions, policies, definitions export and import. */
"use strict";
(() => {
  const TABS = [["users", "Users"], ["vhosts", "Virtual hosts"], ["permissions", "Permissions"],
    ["policies", "Policies"], ["definitions", "Definitions"]];
  const tabs = (active) => EB.h("nav", { class: "tabs", "aria-label": "Admin" }, TABS.filter(([k]) => EB.isAdmin() || k === "policies").map(([k, label]) =>
    EB.h("a", { href: "#/admin/" + k, class: k === active ? "active" : undefined, "aria-current": k === active ? "page" : undefined }, label)));

  const users = async (box) => {
    const refresh = async () => {
      const rows = await EB.get("/api/users");
      EB.clear(list).append(EB.table([
        { label: "Name", key: "name" },
        { label: "Tags", render: (u) => (Array.isArray(u.tags) ? u.tags : String(u.tags || "").split(",")).filter(Boolean)
          .map((t) => EB.h("span", { class: "tag" }, t)) },
        { label: "Password", value: (u) => (u.password_hash ? "set" : "none") },
        { label: "", render: (u) => EB.confirmButton("Delete", "Delete user " + u.name + "?", async () => {
          await EB.api("DELETE", "/api/users/" + EB.enc(u.name));
          EB.ok("User deleted: " + u.name);
          await refresh();
        }) },
      ], rows, { rowData: (u) => ({ user: u.name }) }));
    };
    const list = EB.h("div", { id: "users" });
    box.append(list, EB.section("Add or update a user", EB.form([
      { name: "name", label: "Username", required: true },
      { name: "password", label: "Password", type: "password", autocomplete: "new-password" },
      { name: "tags", label: "Tags (comma-separated)", placeholder: "administrator, monitoring, management, policymaker" },
    ], async (v, form) => {
      const body = { tags: v.tags };
      if (v.password) body.password = v.password; else body.password_hash = "";
      await EB.api("PUT", "/api/users/" + EB.enc(v.name), body);
      EB.ok("User saved: " + v.name);
      form.reset();
      await refresh();
    }, { submit: "Save user", title: "Add a user" })));
    await refresh();
  };

  const vhosts = async (box) => {
    const list = EB.h("div", { id: "vhosts" });
    const refresh = async () => {
      const rows = await EB.get("/api/vhosts");
      EB.clear(list).append(EB.table([
        { label: "Name", key: "name" }, { label: "Description", key: "description" },
        { label: "Ready", key: "messages_ready", num: true }, { label: "Unacked", key: "messages_unacknowledged", num: true },
        { label: "", render: (v) => EB.confirmButton("Delete", "Delete virtual host " + v.name + " and everything in it?", async () => {
          await EB.api("DELETE", "/api/vhosts/" + EB.enc(v.name));
          EB.ok("Virtual host deleted: " + v.name);
          await EB.loadVhosts();
          await refresh();
        }) },
      ], rows));
    };
    box.append(list, EB.section("Add a virtual host", EB.form([
      { name: "name", label: "Name", required: true }, { name: "description", label: "Description" },
    ], async (v, form) => {
      await EB.api("PUT", "/api/vhosts/" + EB.enc(v.name), { description: v.description });
      EB.ok("Virtual host added: " + v.name);
      form.reset();
      await EB.loadVhosts();
      await refresh();
    }, { submit: "Add virtual host", title: "Add a virtual host" })));
    await refresh();
  };

  const permissions = async (box) => {
    const list = EB.h("div", { id: "permissions" });
    const refresh = async () => {
      const rows = await EB.get("/api/permissions");
      EB.clear(list).append(EB.table([
        { label: "User", key: "user" }, { label: "Virtual host", key: "vhost" }, { label: "Configure", key: "configure" },
        { label: "Write", key: "write" }, { label: "Read", key: "read" },
        { label: "", render: (p) => EB.confirmButton("Clear", "Clear " + p.user + "'s permissions in " + p.vhost + "?", async () => {
          await EB.api("DELETE", "/api/permissions/" + EB.enc(p.vhost) + "/" + EB.enc(p.user));
          EB.ok("Permissions cleared");
          await refresh();
        }) },
      ], rows));
    };
    const [names, vh] = await Promise.all([EB.get("/api/users"), EB.vhostNames()]);
    box.append(list, EB.section("Set permissions", EB.form([
      { name: "user", label: "User", type: "select", options: names.map((u) => u.name) },
      { name: "vhost", label: "Virtual host", type: "select", options: vh, value: EB.defaultVhost() },
      { name: "configure", label: "Configure regexp", value: ".*" }, { name: "write", label: "Write regexp", value: ".*" },
      { name: "read", label: "Read regexp", value: ".*" },
    ], async (v) => {
      await EB.api("PUT", "/api/permissions/" + EB.enc(v.vhost) + "/" + EB.enc(v.user),
        { configure: v.configure, write: v.write, read: v.read });
      EB.ok("Permissions set for " + v.user);
      await refresh();
    }, { submit: "Set permissions", title: "Set permissions" })));
    await refresh();
  };

  const policies = async (box) => {
    const list = EB.h("div", { id: "policies" });
    const refresh = async () => {
      const rows = await EB.get(EB.scoped("/api/policies"));
      EB.clear(list).append(EB.table([
        { label: "Virtual host", key: "vhost" }, { label: "Name", key: "name" }, { label: "Pattern", key: "pattern" },
        { label: "Apply to", key: "apply-to" }, { label: "Definition", value: (p) => EB.json(p.definition) },
        { label: "Priority", key: "priority", num: true },
        { label: "", render: (p) => EB.confirmButton("Delete", "Delete policy " + p.name + "?", async () => {
          await EB.api("DELETE", "/api/policies/" + EB.enc(p.vhost) + "/" + EB.enc(p.name));
          EB.ok("Policy deleted: " + p.name);
          await refresh();
        }) },
      ], rows, { empty: "No policies.", rowData: (p) => ({ policy: p.name }) }));
    };
    box.append(list, EB.section("Add or update a policy", EB.form([
      { name: "vhost", label: "Virtual host", type: "select", options: await EB.vhostNames(), value: EB.defaultVhost() },
      { name: "name", label: "Name", required: true }, { name: "pattern", label: "Pattern (regexp)", required: true, value: ".*" },
      { name: "apply_to", label: "Apply to", type: "select", options: ["queues", "exchanges", "all", "classic_queues",
        "quorum_queues", "streams"] },
      { name: "priority", label: "Priority", type: "number", value: 0 },
      { name: "definition", label: "Definition (JSON)", type: "textarea", wide: true, required: true,
        placeholder: '{"max-length": 1000, "dead-letter-exchange": "dlx"}' },
    ], async (v) => {
      await EB.api("PUT", "/api/policies/" + EB.enc(v.vhost) + "/" + EB.enc(v.name), { pattern: v.pattern,
        "apply-to": v.apply_to, priority: v.priority || 0, definition: EB.parseObject(v.definition, "Definition") });
      EB.ok("Policy saved: " + v.name);
      await refresh();
    }, { submit: "Save policy", title: "Add a policy" })));
    await refresh();
  };

  const definitions = async (box) => {
    const download = EB.h("button", { type: "button", class: "primary", id: "export-definitions" }, "Download definitions");
    download.addEventListener("click", async () => {
      try {
        const defs = await EB.get(EB.scoped("/api/definitions"));
        const blob = new Blob([JSON.stringify(defs, null, 2)], { type: "application/json" });
        const a = EB.h("a", { href: URL.createObjectURL(blob), download: "definitions.json" });
        document.body.append(a);
        a.click();
        a.remove();
        EB.ok("Definitions exported");
      } catch (err) { EB.fail(err); }
    });
    const file = EB.h("input", { type: "file", accept: "application/json,.json", id: "definitions-file" });
    box.append(EB.section("Export", EB.h("p", { class: "muted" }, "Users, virtual hosts, permissions, policies, queues, " +
      "exchanges and bindings" + (EB.vhost() ? " of " + EB.vhost() : "") + " as JSON."), download),
    EB.section("Import", EB.h("p", { class: "muted" }, "Choose a definitions file or paste its JSON."),
      EB.h("label", { for: "definitions-file" }, "Definitions file", file),
      EB.form([{ name: "json", label: "Definitions (JSON)", type: "textarea", wide: true }], async (v) => {
        let text = v.json;
        if (!text.trim() && file.files.length) text = await file.files[0].text();
        EB.parseObject(text, "Definitions");
        await EB.api("POST", EB.scoped("/api/definitions"), text);
        EB.ok("Definitions imported");
        await EB.loadVhosts();
      }, { submit: "Upload definitions", title: "Import definitions" })));
  };

  const PAGES = { users, vhosts, permissions, policies, definitions };
  EB.route("admin", async (main, parts) => {
    // administrators see every tab; a policymaker its policies
    const tab = !EB.isAdmin() ? "policies" : PAGES[parts[0]] ? parts[0] : "users";
    main.append(EB.h("h1", {}, "Admin"), tabs(tab));
    const box = EB.h("div", { id: "admin-" + tab });
    main.append(box);
    await PAGES[tab](box);
  });
})();
