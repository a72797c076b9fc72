/* Forms: fields described as data, submitted with the button disabled while the API works;
   any API error is shown as a message and the form stays as typed. */
"use strict";
(() => {
  let fieldSeq = 0;
  const field = (f) => {
    const id = "f" + (fieldSeq += 1);
    const common = { id, name: f.name, required: f.required, placeholder: f.placeholder, autocomplete: f.autocomplete || "off" };
    let input;
    if (f.type === "select") {
      input = EB.h("select", common, (f.options || []).map((o) => {
        const [value, text] = Array.isArray(o) ? o : [o, o];
        return EB.h("option", { value, selected: String(f.value) === String(value) }, text);
      }));
    } else if (f.type === "textarea") {
      input = EB.h("textarea", common, f.value || "");
    } else if (f.type === "checkbox") {
      input = EB.h("input", { ...common, type: "checkbox", checked: !!f.value });
      return EB.h("label", { class: "check" + (f.wide ? " wide" : ""), for: id }, input, f.label);
    } else {
      input = EB.h("input", { ...common, type: f.type || "text", value: f.value === undefined ? "" : f.value,
        min: f.min, step: f.step });
    }
    return EB.h("label", { for: id, class: f.wide ? "wide" : undefined }, f.label, input);
  };

  /* form(fields, onSubmit(values, form), {submit: "Add", class: "grid", title}) */
  EB.form = (fields, onSubmit, opts) => {
    opts = opts || {};
    const button = EB.h("button", { type: "submit", class: "primary" }, opts.submit || "Save");
    const form = EB.h("form", { class: opts.class || "grid", "aria-label": opts.title }, fields.map(field), button);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const values = {};
      for (const f of fields) {
        const el = form.elements[f.name];
        if (f.type === "checkbox") values[f.name] = el.checked;
        else if (f.type === "number") values[f.name] = el.value === "" ? undefined : Number(el.value);
        else values[f.name] = el.value;
      }
      button.disabled = true;
      try {
        await onSubmit(values, form);
      } catch (err) {
        EB.fail(err);
      } finally {
        button.disabled = false;
      }
    });
    return form;
  };

  /* JSON typed in a field: {} when empty, a clear message when it is not a JSON object. */
  EB.parseObject = (text, what) => {
    if (!text || !text.trim()) return {};
    let value;
    try { value = JSON.parse(text); } catch (err) { throw new Error(what + " must be JSON: " + err.message); }
    if (typeof value !== "object" || value === null || Array.isArray(value)) throw new Error(what + " must be a JSON object");
    return value;
  };

  /* A button that asks again in place (no browser dialog) before doing something irreversible. */
  EB.confirmButton = (label, question, action, opts) => {
    opts = opts || {};
    const wrap = EB.h("span", { class: "confirm" });
    const first = EB.h("button", { type: "button", class: opts.class || "danger", "aria-label": opts.ariaLabel }, label);
    const reset = () => { EB.clear(wrap); wrap.append(first); first.focus(); };
    first.addEventListener("click", () => {
      const yes = EB.h("button", { type: "button", class: "danger" }, "Yes, " + label.toLowerCase());
      const no = EB.h("button", { type: "button", onclick: reset }, "Cancel");
      yes.addEventListener("click", async () => {
        yes.disabled = true;
        try { await action(); } catch (err) { EB.fail(err); reset(); }
      });
      EB.clear(wrap);
      wrap.append(EB.h("span", {}, question), yes, no);
      yes.focus();
    });
    wrap.append(first);
    return wrap;
  };

  let vhostCache = null;
  EB.vhostNames = async (fresh) => {
    if (!vhostCache || fresh) vhostCache = (await EB.get("/api/vhosts")).map((v) => v.name);
    return vhostCache;
  };
  EB.defaultVhost = () => EB.vhost() || "/";
})();
