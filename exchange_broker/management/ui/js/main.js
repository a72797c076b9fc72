/* Start-up: the login form (checked against /api/whoami, so the broker's users and management
   tags decide; single sign-on in sso.js), the header (user, vhost choice, log out) and the first page. */
"use strict";
(() => {
  EB.loadVhosts = async () => {
    const select = EB.$("#vhost-select");
    const keep = select.value;
    const names = await EB.vhostNames(true);
    EB.append(EB.clear(select), [EB.h("option", { value: "" }, "All"),
      names.map((n) => EB.h("option", { value: n, selected: n === keep }, n))]);
  };

  const showHeader = async () => {
    const user = EB.user();
    EB.$("#top").hidden = false;
    EB.$("#whoami").textContent = user.name + " (" + (user.tags.join(", ") || "no tags") + ")";
    EB.$("#nav-admin").hidden = !(EB.isAdmin() || user.tags.includes("policymaker"));
    try {
      const ov = await EB.get("/api/overview");
      EB.sampleIncr = Math.ceil((ov.collect_statistics_interval || 5000) / 1000);
      EB.refreshMs = Math.max(1000, Math.min(5000, ov.collect_statistics_interval || 5000));
      await EB.loadVhosts();
    } catch (err) { EB.fail(err); }
  };

  EB.loginPage = (main) => {
    EB.$("#top").hidden = true;
    const form = EB.form([
      { name: "username", label: "Username", required: true, autocomplete: "username" },
      { name: "password", label: "Password", type: "password", autocomplete: "current-password" },
    ], async (v) => {
      const auth = EB.encodeBasic(v.username, v.password);
      await EB.logIn(auth);
      EB.clearMessages();
      await showHeader();
      EB.render();
    }, { class: "", submit: "Log in", title: "Log in" });
    const card = EB.h("div", { class: "login card" }, EB.h("h1", {}, "exchange-broker management"),
      EB.h("p", { class: "muted" }, "Log in with a broker user tagged management, policymaker, monitoring or administrator."),
      form);
    main.append(card);
    form.elements.username.focus();
    EB.ssoButton(card);  // single sign-on, when the broker offers it (sso.js)
  };

  const start = async () => {
    EB.$("#logout").addEventListener("click", () => { EB.clearLogin(); EB.clearMessages(); location.hash = "#/overview"; EB.render(); });
    EB.$("#vhost-select").addEventListener("change", () => EB.render());
    window.addEventListener("hashchange", () => { EB.render(); EB.$("#main").focus({ preventScroll: true }); });
    try {
      if (await EB.ssoCallback()) EB.clearMessages();  // back from the identity provider (sso.js)
    } catch (err) { EB.fail(err); }
    if (EB.auth()) await showHeader();
    EB.render();
  };
  start();
})();
