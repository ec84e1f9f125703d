'use strict';
// An HTTP proxy of the test's own in front of the real service that fails on purpose: each
// request takes the next planned fault, and with none planned it is forwarded as it is.

const http = require('node:http');
const { performance } = require('node:perf_hooks');

const HOP_BY_HOP = new Set(['host', 'connection', 'content-length', 'keep-alive',
  'transfer-encoding']);

/** The faults a proxy can play, one request each. */
const fault = {
  /** Answer without forwarding: the service never sees the request. */
  answer: (status, headers = {}, error = 'injected by the test proxy') =>
    ({ status, headers, error }),
  /** Read the request, then close the connection without an answer (nothing forwarded). */
  drop: () => ({ drop: true }),
  /** Forward, let the service act, then lose its answer: answer `status` instead. */
  answerAfterForwarding: (status) => ({ forward: true, status, headers: {},
    error: 'answer lost by the test proxy' }),
  /** Forward, let the service act, then close the connection without its answer. */
  dropAfterForwarding: () => ({ forward: true, drop: true }),
  /** Never answer (until the proxy closes). */
  stall: () => ({ stall: true }),
};

async function startFaultProxy(targetUrl) {
  const planned = [];
  const requests = []; // {method, path, headers, body, at}: what reached the proxy, in order
  let answered = 0;

  async function forward(request, body) {
    const headers = Object.fromEntries(Object.entries(request.headers)
      .filter(([name]) => !HOP_BY_HOP.has(name)));
    const answer = await fetch(targetUrl + request.url, { method: request.method, headers,
      body: body.length ? body : undefined });
    return { status: answer.status, headers: answer.headers, body: await answer.text() };
  }

  async function serve(request, response) {
    const chunks = [];
    for await (const chunk of request) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    requests.push({ method: request.method, path: request.url, headers: request.headers,
      body: body.toString('utf8'), at: performance.now() });
    const next = planned.shift() || { forward: true };
    if (next.stall) return;
    let reply = next;
    if (next.forward) {
      const got = await forward(request, body);
      if (!next.drop && next.status === undefined) reply = got;
    }
    if (next.drop) {
      response.socket.destroy();
      return;
    }
    if (reply.error !== undefined) {
      answered += 1;
      response.writeHead(reply.status, { 'Content-Type': 'application/json',
        'X-Request-Id': `proxy-${answered}`, ...reply.headers });
      response.end(JSON.stringify({ error: reply.error, request_id: `proxy-${answered}` }));
      return;
    }
    const keep = ['content-type', 'x-request-id', 'idempotent-replayed', 'retry-after'];
    response.writeHead(reply.status, Object.fromEntries(keep
      .filter((name) => reply.headers.has(name)).map((name) => [name, reply.headers.get(name)])));
    response.end(reply.body);
  }

  const server = http.createServer((request, response) => {
    serve(request, response).catch((error) => {
      response.socket.destroy();
      process.emitWarning(`test proxy: ${error.message}`);
    });
  });
  await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    /** Queue faults for the next requests, in order. */
    plan(...faults) {
      planned.push(...faults);
    },
    /** Forget the requests seen and the faults not yet played; number answers from 1 again. */
    reset() {
      planned.length = 0;
      requests.length = 0;
      answered = 0;
    },
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => { server.close(resolve); });
    },
  };
}

/** A context store of the test's own (the service's wire contract: POST with the user token as
 *  a Bearer token, answered by {"tags": [...]}); while `failing` is set it answers 503, which
 *  the service turns into 502 `context store request failed`. */
async function startContextStore() {
  const store = { calls: 0, failing: false };
  const server = http.createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      store.calls += 1;
      const token = (request.headers.authorization || '').replace(/^Bearer /, '');
      response.writeHead(store.failing ? 503 : 200, { 'Content-Type': 'application/json' });
      response.end(JSON.stringify(store.failing ? { error: 'down' }
        : { tags: token.includes('shop') ? ['shopping'] : [] }));
    });
  });
  await new Promise((resolve) => { server.listen(0, '127.0.0.1', resolve); });
  store.url = `http://127.0.0.1:${server.address().port}/tags`;
  store.close = () => {
    server.closeAllConnections();
    return new Promise((resolve) => { server.close(resolve); });
  };
  return store;
}

/** A local port nothing listens on: connecting to it is refused. */
async function closedPort() {
  const probe = http.createServer();
  await new Promise((resolve) => { probe.listen(0, '127.0.0.1', resolve); });
  const { port } = probe.address();
  await new Promise((resolve) => { probe.close(resolve); });
  return port;
}

module.exports = { closedPort, fault, startContextStore, startFaultProxy };
