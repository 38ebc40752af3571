// The API client and the session.
//
// Where the tokens live:
// - the access token (short-lived JWT) only in this module's memory: no storage, no cookie;
// - the refresh token in sessionStorage of the dashboard's origin, so a reload keeps the tab
//   logged in and closing the tab forgets it. Uploaded files are served with
//   "Content-Security-Policy: sandbox", which gives them an opaque origin: a script in an
//   uploaded file cannot read this origin's storage. The dashboard's own CSP allows only its
//   own scripts, and views write untrusted text with textContent, never innerHTML.
// A 401 triggers one silent POST /auth/refresh and one retry; if that fails the session ends.

const REFRESH_KEY = 'mediasrv.refresh_token';

let access = null; // the access token string, in memory only
let refreshing = null; // the refresh in flight, shared by every caller
const sessionListeners = new Set();

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || (status ? `Request failed (HTTP ${status})` : 'Network error'));
    this.status = status;
    this.code = body && body.code;
    this.body = body;
  }
}

export function onSessionEnd(listener) {
  sessionListeners.add(listener);
}

function startSession(session) {
  access = session.access_token;
  sessionStorage.setItem(REFRESH_KEY, session.refresh_token);
}

function endSession() {
  const had = access !== null || sessionStorage.getItem(REFRESH_KEY) !== null;
  access = null;
  sessionStorage.removeItem(REFRESH_KEY);
  if (had) sessionListeners.forEach((listener) => listener());
}

export function hasSession() {
  return access !== null || sessionStorage.getItem(REFRESH_KEY) !== null;
}

function parseBody(text) {
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return { error: text.slice(0, 200) };
  }
}

function withQuery(path, query) {
  if (!query) return path;
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== '') params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

async function send(method, path, { json, token, query } = {}) {
  const headers = {};
  if (json !== undefined) headers['Content-Type'] = 'application/json';
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(withQuery(path, query), {
      method, headers, body: json === undefined ? undefined : JSON.stringify(json),
      credentials: 'omit', cache: 'no-store',
    });
  } catch {
    throw new ApiError(0, null);
  }
  const body = response.status === 204 ? null : parseBody(await response.text());
  return { status: response.status, ok: response.ok, body, headers: response.headers };
}

/** A call that needs no credential (register, login, forgot and reset password). */
export async function anonymous(method, path, json) {
  const r = await send(method, path, { json });
  if (!r.ok) throw new ApiError(r.status, r.body);
  return r.body;
}

export async function login(email, password) {
  const body = await anonymous('POST', '/auth/login', { email, password });
  startSession(body.session);
  return body.user;
}

export async function logout() {
  const token = sessionStorage.getItem(REFRESH_KEY);
  access = null;
  sessionStorage.clear(); // everything this tab kept for the dashboard
  if (token) {
    try {
      await send('POST', '/auth/logout', { json: { refresh_token: token } });
    } catch {
      // Offline: the token is forgotten here and expires on the server.
    }
  }
}

/** Trade the refresh token for a new session; concurrent callers share one request. */
export function refresh() {
  if (!refreshing) {
    refreshing = (async () => {
      const token = sessionStorage.getItem(REFRESH_KEY);
      if (!token) {
        endSession();
        throw new ApiError(401, { error: 'Your session has ended; log in again', code: 'NO_SESSION' });
      }
      const r = await send('POST', '/auth/refresh', { json: { refresh_token: token } });
      if (r.status === 401) {
        endSession();
        throw new ApiError(401, { error: 'Your session has ended; log in again', code: 'SESSION_ENDED' });
      }
      if (!r.ok) throw new ApiError(r.status, r.body);
      startSession(r.body.session);
    })().finally(() => {
      refreshing = null;
    });
  }
  return refreshing;
}

async function currentToken() {
  if (access === null) await refresh();
  return access;
}

/** An authenticated JSON call: a 401 refreshes the session once, silently, and retries. */
export async function api(method, path, { json, query } = {}) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const r = await send(method, path, { json, token, query });
    if (r.status === 401 && attempt === 0) {
      if (access === token) access = null; // expired or revoked: refresh, unless another call did
      continue;
    }
    if (r.status === 401) endSession();
    if (!r.ok) throw new ApiError(r.status, r.body);
    return r.body;
  }
}

/** An authenticated GET of bytes (a private thumbnail): a Blob. */
export async function fetchBlob(path) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const response = await fetch(path, { headers: { Authorization: `Bearer ${token}` }, credentials: 'omit' });
    if (response.status === 401 && attempt === 0) {
      if (access === token) access = null;
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, null);
    return response.blob();
  }
}

/**
 * Upload one File as a raw body with XHR (fetch cannot report upload progress).
 * onProgress(loaded, total) is called as bytes leave; resolves with the created file.
 */
export async function upload(file, { isPublic, onProgress }) {
  for (let attempt = 0; ; attempt += 1) {
    const token = await currentToken();
    const r = await new Promise((resolve) => {
      const xhr = new XMLHttpRequest();
      xhr.open('POST', withQuery('/files', { isPublic: isPublic ? 'true' : 'false' }));
      xhr.setRequestHeader('Authorization', `Bearer ${token}`);
      xhr.setRequestHeader('Content-Type', file.type || 'application/octet-stream');
      xhr.setRequestHeader('x-file-name', encodeURIComponent(file.name));
      xhr.upload.addEventListener('progress', (event) => {
        if (event.lengthComputable) onProgress(event.loaded, event.total);
      });
      xhr.addEventListener('load', () => resolve({ status: xhr.status, body: parseBody(xhr.responseText) }));
      xhr.addEventListener('error', () => resolve({ status: 0, body: null }));
      xhr.send(file);
    });
    if (r.status === 401 && attempt === 0) {
      if (access === token) access = null;
      continue;
    }
    if (r.status === 401) endSession();
    if (r.status !== 201) throw new ApiError(r.status, r.body);
    onProgress(file.size, file.size);
    return r.body.file;
  }
}
