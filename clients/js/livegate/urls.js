// The addresses the client derives from the one it is given (a node's base URL, http(s)
// or ws(s)): the WebSocket and SSE endpoints and `/readyz`; and the numbers it reads out
// of close reasons (`reconnect in 1234 ms`, retry-after seconds).

/** The SSE endpoint for a base URL: ws→http, wss→https, `/v1/sse` in place of `/v1/ws`. */
export function sseEndpointOf(base) {
  let url = base.trim().replace(/[?#].*$/, '');
  url = url.replace(/^ws(s?):\/\//i, (_, s) => `http${s}://`);
  if (!/^https?:\/\//i.test(url)) throw new TypeError(`livegate: not an http(s) or ws(s) URL: ${base}`);
  url = url.replace(/\/+$/, '').replace(/\/v1\/(ws|sse)$/, '');
  return `${url}/v1/sse`;
}

/** The WebSocket endpoint for a base URL: http→ws, https→wss, `/v1/ws` appended. */
export function endpointOf(base) {
  let url = base.trim().replace(/[?#].*$/, '');
  url = url.replace(/^http(s?):\/\//i, (_, s) => `ws${s}://`);
  if (!/^wss?:\/\//i.test(url)) throw new TypeError(`livegate: not an http(s) or ws(s) URL: ${base}`);
  url = url.replace(/\/+$/, '');
  if (!/\/v1\/ws$/.test(url)) url += '/v1/ws';
  return url;
}

/** The `/readyz` of the node whose SSE endpoint is `sseEndpoint`. */
export function readyzOf(sseEndpoint) {
  return sseEndpoint.replace(/\/v1\/sse$/, '/readyz');
}

/** The http(s) base URL of a node (its `public_url`, ws(s):// accepted), without a path to /v1. */
export function baseOf(url) {
  return sseEndpointOf(url).replace(/\/v1\/sse$/, '');
}

/** Whether `text` starts like an absolute http(s) or ws(s) URL. */
export function looksLikeUrl(text) {
  return /^(https?|wss?):\/\//i.test(text);
}

/** The reconnect delay a 1012/1001 close reason suggests, in ms (`reconnect in 1234 ms`). */
export function suggestedDelayMs(reason) {
  if (!reason) return null;
  const ms = /(\d+)\s*ms\b/.exec(reason);
  if (ms) return Number(ms[1]);
  return firstNumber(reason);
}

/** The first whole number in `text`, or null. */
export function firstNumber(text) {
  const match = /\d+/.exec(text || '');
  return match ? Number(match[0]) : null;
}
