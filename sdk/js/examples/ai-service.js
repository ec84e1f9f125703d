'use strict';
// An AI service that signs each answer for the intent it was called with.
//   INTENTGATE_SIGNING_SECRET=sig_live_... node examples/ai-service.js     (bound / payload scheme)
//   INTENTGATE_SIGNING_KEY="$(cat ai-service-key.pem)" node examples/ai-service.js   (ed25519)
// The tenant backend POSTs {"q": "..."} with the intent hash in X-Intent-Hash and passes the
// JSON answer ({match_id, payload, timestamp, signature}) to the gate's verify.

const crypto = require('node:crypto');
const http = require('node:http');
const { signResponse, signResponseEd25519 } = require('intentgate');

const INTENT_HASH = /^sha256:[0-9a-f]{64}$/;
const MAX_BODY = 64 * 1024;

function createAiService({ secret, privateKey, answer }) {
  const key = privateKey && crypto.createPrivateKey(privateKey); // parse the PEM once
  const sign = (intentHash, matchId, timestamp, payload) => (key
    ? signResponseEd25519(key, intentHash, matchId, timestamp, payload)
    : signResponse(secret, intentHash, matchId, timestamp, payload));

  return http.createServer((request, response) => {
    const reply = (status, body) => {
      response.writeHead(status, { 'Content-Type': 'application/json' });
      response.end(JSON.stringify(body));
    };
    const intentHash = request.headers['x-intent-hash'];
    if (!INTENT_HASH.test(intentHash || '')) return reply(400, { error: 'X-Intent-Hash missing' });
    const chunks = [];
    let size = 0;
    request.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) request.destroy();
      else chunks.push(chunk);
    });
    request.on('end', async () => {
      let question;
      try {
        question = JSON.parse(Buffer.concat(chunks).toString('utf8')).q;
      } catch {
        return reply(400, { error: 'body must be JSON {"q": "..."}' });
      }
      const payload = { answer: await answer(String(question)) };
      const matchId = crypto.randomUUID();
      const timestamp = Math.floor(Date.now() / 1000); // sign when answering, not ahead of time
      const signature = sign(intentHash, matchId, timestamp, payload);
      return reply(200, { match_id: matchId, payload, timestamp, signature });
    });
    return undefined;
  });
}

module.exports = { createAiService };

if (require.main === module) {
  const server = createAiService({
    secret: process.env.INTENTGATE_SIGNING_SECRET,
    privateKey: process.env.INTENTGATE_SIGNING_KEY,
    answer: async (question) => `You asked: ${question}`, // your model goes here
  });
  server.listen(Number(process.env.PORT || 8080), '127.0.0.1');
}
