/* Single sign-on on the login page (as RabbitMQ's management UI with OAuth 2.0): when the broker
   has --management-oauth-client-id (GET /api/auth), the login page offers the identity provider.
   Authorization code flow with PKCE (RFC 7636): a random verifier kept in sessionStorage, its
   SHA-256 as the challenge; the provider sends the browser back to this page with ?code&state,
   the code and verifier are traded for an access token at the provider's token endpoint, and the
   token is then this UI's bearer credential for the API (the broker's oauth2 backend checks it). */
"use strict";
(() => {
  const FLOW_KEY = "exchange-broker.sso";
  let settings = null;

  const b64url = (bytes) => btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  const random = (n) => b64url(crypto.getRandomValues(new Uint8Array(n)));
  const here = () => location.origin + location.pathname;

  const discover = async (provider) => {
    const resp = await fetch(provider.replace(/\/$/, "") + "/.well-known/openid-configuration");
    if (!resp.ok) throw new Error("The identity provider's configuration cannot be read (HTTP " + resp.status + ")");
    return resp.json();
  };

  EB.ssoSettings = async () => {
    if (settings === null) {
      try { settings = await EB.api("GET", "/api/auth", undefined, "-"); } catch (err) { settings = { oauth_enabled: false }; }
    }
    return settings;
  };

  const begin = async () => {
    const s = await EB.ssoSettings();
    const idp = await discover(s.oauth_provider_url);
    const verifier = random(48);
    const state = random(24);
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
    sessionStorage.setItem(FLOW_KEY, JSON.stringify({ verifier, state, token_endpoint: idp.token_endpoint,
      hash: location.hash }));
    const q = new URLSearchParams({ response_type: "code", client_id: s.oauth_client_id, redirect_uri: here(),
      scope: s.oauth_scopes, state, code_challenge: b64url(digest), code_challenge_method: "S256" });
    location.assign(idp.authorization_endpoint + "?" + q.toString());
  };

  /* Back from the provider: trade the code for a token, then log in with it. True when handled. */
  EB.ssoCallback = async () => {
    const q = new URLSearchParams(location.search);
    if (!q.has("code") && !q.has("error")) return false;
    const flow = JSON.parse(sessionStorage.getItem(FLOW_KEY) || "null");
    sessionStorage.removeItem(FLOW_KEY);
    history.replaceState(null, "", here() + ((flow && flow.hash) || "#/overview"));
    if (q.has("error")) throw new Error("Single sign-on failed: " + q.get("error") + " " + (q.get("error_description") || ""));
    if (!flow || q.get("state") !== flow.state) throw new Error("Single sign-on failed: the answer does not match the request (state)");
    const s = await EB.ssoSettings();
    const resp = await fetch(flow.token_endpoint, { method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ grant_type: "authorization_code", code: q.get("code"), redirect_uri: here(),
        client_id: s.oauth_client_id, code_verifier: flow.verifier }).toString() });
    const answer = await resp.json().catch(() => ({}));
    if (!resp.ok || !answer.access_token) throw new Error("Single sign-on failed: the token was refused (" + (answer.error || resp.status) + ")");
    await EB.logIn("Bearer " + answer.access_token);
    return true;
  };

  /* The login page's button, when the broker offers single sign-on. */
  EB.ssoButton = async (card) => {
    const s = await EB.ssoSettings();
    if (!s.oauth_enabled) return;
    const button = EB.h("button", { type: "button", id: "sso-login", class: "primary" }, "Sign in with OAuth 2.0");
    button.addEventListener("click", () => begin().catch((err) => EB.fail(err)));
    card.append(EB.h("p", { class: "muted" }, "Or sign in with your organisation's identity provider:"), button);
  };
})();
