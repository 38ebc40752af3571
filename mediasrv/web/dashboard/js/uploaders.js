// Uploader configurations built from an API key, as Zipline offers: a ShareX custom uploader
// (.sxcu) and a shell script for Flameshot (or any file, from a terminal or a file manager).
// Both send the file as the raw body of POST /files with its name in ?name= and print or
// return the file's public URL. The key is in the file: the page says so, and where to keep it.
import { api } from './api.js';
import { busy, errorBox, h, select } from './dom.js';

const TOOLS = [['sharex', 'ShareX (Windows)'], ['shell', 'Flameshot or a shell script (Linux, macOS)']];

/** The server's URL as the dashboard reaches it. */
function serverUrl() {
  return location.origin;
}

/** A ShareX custom uploader (the .sxcu JSON, ShareX 13.7 and later). */
export function sharexConfig(key, base = serverUrl()) {
  const host = new URL(base).host;
  return {
    Version: '15.0.0',
    Name: `mediasrv (${host})`,
    DestinationType: 'ImageUploader, TextUploader, FileUploader',
    RequestMethod: 'POST',
    RequestURL: `${base}/files`,
    Parameters: { isPublic: 'true', name: '{filename}' },
    Headers: { 'X-Api-Key': key },
    Body: 'Binary',
    URL: '{json:file.public_url}',
    ThumbnailURL: '{json:file.public_url}?width=320',
    DeletionURL: `${base}/#/file/{json:file.file_id}`,
    ErrorMessage: '{json:error}',
  };
}

/** A POSIX shell script: uploads its arguments, or a Flameshot screenshot when given none. */
export function shellScript(key, base = serverUrl()) {
  return `#!/bin/sh
# Upload files to mediasrv (${base}) and print their links; with no file, take a screenshot
# with Flameshot first. The link is also copied to the clipboard (wl-copy, xclip or pbcopy).
# It holds an API key: keep it private (chmod 700), revoke the key on the API keys page if lost.
#   mediasrv-upload.sh photo.jpg notes.pdf     # or bind it to a key for screenshots
set -eu
MEDIASRV_URL='${base}'
MEDIASRV_KEY='${key}'
if [ "$#" -eq 0 ]; then
  shot="$(mktemp "\${TMPDIR:-/tmp}/screenshot-XXXXXX").png"
  flameshot gui --raw > "$shot"
  [ -s "$shot" ] || { echo "no screenshot taken" >&2; exit 1; }
  set -- "$shot"
fi
for f in "$@"; do
  type="$(file --brief --mime-type "$f" 2>/dev/null || echo application/octet-stream)"
  name="$(printf '%s' "$(basename "$f")" | od -An -tx1 -v | tr -d ' \\n' | sed 's/../%&/g')"  # percent-encoded
  answer="$(curl -sS -X POST "$MEDIASRV_URL/files?isPublic=true" -H "X-Api-Key: $MEDIASRV_KEY" \\
    -H "Content-Type: $type" -H "x-file-name: $name" --data-binary @"$f")"
  url="$(printf '%s' "$answer" | sed -n 's/.*"public_url": *"\\([^"]*\\)".*/\\1/p')"
  if [ -z "$url" ]; then
    echo "$f: $(printf '%s' "$answer" | sed -n 's/.*"error": *"\\([^"]*\\)".*/\\1/p')" >&2
    exit 1
  fi
  echo "$url"
  if command -v wl-copy >/dev/null 2>&1; then printf '%s' "$url" | wl-copy
  elif command -v xclip >/dev/null 2>&1; then printf '%s' "$url" | xclip -selection clipboard
  elif command -v pbcopy >/dev/null 2>&1; then printf '%s' "$url" | pbcopy
  fi
done
`;
}

function download(filename, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = h('a', { href: url, download: filename, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** Save the configuration of `tool` ('sharex' or 'shell') made with `key`. */
export function saveConfiguration(tool, key) {
  const host = location.hostname.replace(/[^A-Za-z0-9.-]/g, '_');
  if (tool === 'sharex') {
    download(`mediasrv-${host}.sxcu`, `${JSON.stringify(sharexConfig(key), null, 2)}\n`, 'application/json');
  } else {
    download(`mediasrv-upload-${host}.sh`, shellScript(key), 'text/x-shellscript');
  }
}

/** The buttons under a key just created: its configurations. */
export function configurationButtons(key) {
  return h('div', { class: 'row' },
    h('button', { type: 'button', onclick: () => saveConfiguration('sharex', key) }, 'Download ShareX configuration'),
    h('button', { type: 'button', onclick: () => saveConfiguration('shell', key) },
      'Download Flameshot / shell script'));
}

/** The "Uploaders" card: make a key for a tool and download its configuration in one step. */
export function uploadersCard({ announce, created }) {
  const tool = select('Uploader', TOOLS);
  const error = errorBox();
  const form = h('form', { class: 'row-form' }, tool.wrap,
    h('button', { type: 'submit', class: 'primary' }, 'Create a key and download the configuration'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.clear();
    const which = tool.input.value;
    try {
      const name = which === 'sharex' ? 'ShareX' : 'Flameshot / shell';
      const key = await busy(form, () => api('POST', '/auth/api-keys', { json: { name } }));
      saveConfiguration(which, key.key);
      announce(`Created the API key “${name}” and saved its configuration. Revoke the key here to stop it.`);
      created();
    } catch (e) {
      error.show(e.message);
    }
  });
  return h('section', { class: 'card uploaders', 'aria-labelledby': 'uploaders-title' },
    h('h2', { id: 'uploaders-title' }, 'Upload from your desktop'),
    h('p', { class: 'muted' }, 'ShareX and Flameshot upload a screenshot and copy its link in one key press. '
      + 'This makes an API key for one of them and saves its configuration: in ShareX, open the .sxcu file '
      + '(Destinations → Custom uploader settings → Import); for Flameshot, make the script executable and bind it '
      + 'to a key. The file holds the key: keep it private.'),
    form, error.el);
}
