// Tabs of the dashboard share one session over a BroadcastChannel, so a second tab (or a
// bookmark opened while a dashboard tab is open) starts logged in, and logging out in one tab
// logs out every tab.
//
// Why this and not a refresh cookie: the tokens stay where they were (the access token in each
// tab's memory, the refresh token in sessionStorage): nothing new is written to disk and no
// cookie is sent with requests. A BroadcastChannel reaches only documents of the dashboard's
// origin; uploaded files are served with a "sandbox" CSP, which gives them an opaque origin, so
// they can neither listen nor ask. Closing the last dashboard tab still ends the session.
//
// Refresh tokens are single use, and a retired one presented again ends every session of the
// account (reuse detection), so only one tab ever refreshes: the leader, whichever tab holds
// the Web Lock LEADER_LOCK. Every other tab with the session queues for that lock and takes
// over when the leader's tab closes; each new session (login, refresh) is broadcast, so the
// next leader always holds the newest refresh token. A follower whose access token expired asks
// the leader, which refreshes and broadcasts.

const CHANNEL = 'mediasrv.session';
const LEADER_LOCK = 'mediasrv.session.leader';
const ASK_MS = 1500; // how long a new tab waits for another tab's answer
const REFRESH_WAIT_MS = 8000; // how long a follower waits for the leader's refresh

const supported = typeof BroadcastChannel === 'function' && typeof navigator !== 'undefined' && !!navigator.locks;
let channel = null;
let hooks = null; // {adopt(session), ended(reason), current(), refreshHere()}
let leader = false;
let release = null; // ends the leader's hold on the lock
let queued = null; // AbortController of a pending lock request
const waiters = new Set();

function post(message) {
  if (channel) channel.postMessage(message);
}

function onMessage(message) {
  if (!message || typeof message !== 'object') return;
  if (message.type === 'hello' || message.type === 'refresh') {
    if (!leader) return;
    const current = hooks.current();
    if (message.type === 'hello' && current && current.access_token) post({ type: 'session', session: current });
    else hooks.refreshHere().catch(() => {}); // broadcasts the new session, or ends it for all
  } else if (message.type === 'session' && message.session) {
    hooks.adopt(message.session);
    join();
    waiters.forEach((resolve) => resolve(message.session));
    waiters.clear();
  } else if (message.type === 'ended') {
    leave();
    hooks.ended(message.reason || 'ended');
  }
}

/** Start listening; `h` are the session's hooks in api.js. */
export function connectTabs(h) {
  hooks = h;
  if (!supported) return;
  channel = new BroadcastChannel(CHANNEL);
  channel.addEventListener('message', (event) => onMessage(event.data));
}

export function isLeader() {
  return !supported || leader;
}

function hold() {
  leader = true;
  queued = null;
  return new Promise((resolve) => { release = resolve; });
}

/** Queue for leadership (a tab that has the session); at once if nobody leads. */
function join() {
  if (!supported || leader || queued) return;
  queued = new AbortController();
  navigator.locks.request(LEADER_LOCK, { signal: queued.signal }, hold).catch(() => {});
}

/** Take the lead if nobody has it: true when this tab leads now. */
function claim() {
  if (!supported) return Promise.resolve(true);
  if (leader) return Promise.resolve(true);
  return new Promise((resolve) => {
    navigator.locks.request(LEADER_LOCK, { ifAvailable: true }, (lock) => {
      if (!lock) {
        resolve(false);
        return null;
      }
      resolve(true);
      return hold();
    }).catch(() => resolve(false));
  });
}

/** Stop leading or queueing (the session ended here). */
export function leave() {
  leader = false;
  if (release) release();
  release = null;
  if (queued) queued.abort();
  queued = null;
}

function waitForSession(timeoutMs, accept = () => true) {
  return new Promise((resolve) => {
    const done = (session) => {
      if (!accept(session)) return;
      clearTimeout(timer);
      waiters.delete(done);
      resolve(session);
    };
    const timer = setTimeout(() => {
      waiters.delete(done);
      resolve(null);
    }, timeoutMs);
    waiters.add(done);
  });
}

/** A session just started in this tab (log in, refresh): the other tabs take it too. */
export function shareSession(session) {
  join();
  post({ type: 'session', session });
}

/** The session ended in this tab (log out, or refused): every tab ends it. */
export function endEverywhere(reason) {
  leave();
  post({ type: 'ended', reason });
}

/**
 * At page load: a session from another tab if one has it, else this tab's own (a reload), which
 * it then leads. Resolves 'adopted' (the hooks got a session), 'lead' (refresh the stored token
 * here) or 'none'.
 */
export async function resumeSession(hasStoredToken) {
  if (!supported) return hasStoredToken ? 'lead' : 'none';
  if (hasStoredToken && await claim()) return 'lead';
  const held = (await navigator.locks.query()).held.some((lock) => lock.name === LEADER_LOCK);
  if (!held) return hasStoredToken ? 'lead' : 'none';
  const answer = waitForSession(ASK_MS);
  post({ type: 'hello' });
  if (await answer) return 'adopted';
  return hasStoredToken ? 'lead' : 'none'; // nobody answered: this tab's token is the only one
}

/** A follower's access token `failed`: ask the leader for a new session; null if none came. */
export async function askLeaderToRefresh(failed) {
  const answer = waitForSession(REFRESH_WAIT_MS, (session) => session.access_token !== failed);
  post({ type: 'refresh' });
  return answer;
}
