// Print a Corral user's job event feed, one JSON object a line (docs/integrations.md, "Following the feed").
//
//   CORRAL_CREDENTIALS=~/.corral/credentials.json node follow.js [--idle-exit SECONDS]
//
// The credentials file is the user's own ({"url", "user", "password"}). The feed service keeps a durable
// consumer for each user, `feed-<user>`, filtered on that user's jobs: this script binds to it, prints
// each message with its subject and acknowledges it, so a restarted follower goes on where it stopped.
// A user may not create consumers (docs/security.md), so the consumer appears once the user's first job is
// in the feed; until then the script waits for it. With --idle-exit it ends once no message came for that
// many seconds (for a batch job or a test); without, it follows for ever.
"use strict";

const fs = require("fs");
const { connect } = require("nats");

const STREAM = "CORRAL_FEED";

function options(argv) {
  const at = argv.indexOf("--idle-exit");
  return { idleExit: at >= 0 ? Number(argv[at + 1]) : null };
}

function credentials() {
  const path = process.env.CORRAL_CREDENTIALS;
  if (!path) {
    throw new Error("set CORRAL_CREDENTIALS to your credentials file (corral up prints where it is)");
  }
  return JSON.parse(fs.readFileSync(path, "utf8"));
}

async function consumerOf(js, name, deadline) {
  // The feed service creates it with the user's first job; wait for it as long as we may.
  for (;;) {
    try {
      return await js.consumers.get(STREAM, name);
    } catch (err) {
      if (deadline !== null && Date.now() > deadline) {
        return null;
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
}

async function main() {
  const { idleExit } = options(process.argv.slice(2));
  const creds = credentials();
  const nc = await connect({
    servers: creds.url.split(",").map((url) => url.trim()),
    user: creds.user,
    pass: creds.password,
    // Replies come to the user's own inbox: the only one the server lets them read.
    inboxPrefix: `_INBOX.${creds.user}`,
  });
  const js = nc.jetstream();
  const idleMs = idleExit === null ? null : idleExit * 1000;
  const consumer = await consumerOf(js, `feed-${creds.user}`, idleMs === null ? null : Date.now() + idleMs);
  let idleSince = Date.now();
  while (consumer !== null) {
    const batch = await consumer.fetch({ max_messages: 256, expires: 1000 });
    let got = 0;
    for await (const msg of batch) {
      got += 1;
      const message = JSON.parse(new TextDecoder().decode(msg.data));
      process.stdout.write(JSON.stringify({ subject: msg.subject, ...message }) + "\n");
      msg.ack();
    }
    if (got > 0) {
      idleSince = Date.now();
    } else if (idleMs !== null && Date.now() - idleSince >= idleMs) {
      break;
    }
  }
  await nc.drain();
}

main().catch((err) => {
  process.stderr.write(`follow.js: ${err.message}\n`);
  process.exit(1);
});
