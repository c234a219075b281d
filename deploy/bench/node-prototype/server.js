// The design notes' Node prototype of the redirect, as make bench runs it
// beside kurz's redirect service: GET /:code reads the link from Redis
// (key "l:<code>", the URL as a plain string), appends the click to a
// stream without waiting for Redis, and answers 302 (404 if unknown).
// PORT and REDIS_URL come from the environment (deploy/bench/peers.sh).
'use strict';
const http = require('node:http');
const Redis = require('ioredis');

const redis = new Redis(process.env.REDIS_URL || 'redis://127.0.0.1:9309');

http.createServer(async (req, res) => {
  const code = req.url.slice(1);
  let url = null;
  if (req.method === 'GET' && /^[0-9A-Za-z]{1,32}$/.test(code)) {
    url = await redis.get('l:' + code).catch(() => null);
  }
  if (url === null) {
    res.writeHead(404).end();
    return;
  }
  redis.xadd('clicks', 'MAXLEN', '~', '1000000', '*', 'code', code, 'at', Date.now()).catch(() => {});
  res.writeHead(302, { Location: url, 'Cache-Control': 'private, max-age=0' }).end();
}).listen(Number(process.env.PORT || 9308), '127.0.0.1');
