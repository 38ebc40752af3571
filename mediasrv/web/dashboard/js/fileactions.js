// What can be done with one file from the gallery (a card's menu, the lightbox): open its page,
// download it, copy its links, copy it as Markdown / HTML / BBCode, delete it. A private file's
// links are signed URLs made on demand (one hour), so the session token never goes in a URL.
import { api } from './api.js';
import { FORMATS, snippet } from './copyas.js';
import { confirmAction, copyText } from './dom.js';
import { toast } from './toast.js';

const SIGNED_FOR_S = 3600;

export const displayName = (file) => file.name || file.file_id;

/** A signed view and download URL of a file ({url, download_url, expires_at}). */
export function signFile(file, expiresIn = SIGNED_FOR_S) {
  return api('POST', `/files/${encodeURIComponent(file.file_id)}/signed-url`, { json: { expires_in: expiresIn } });
}

/** A URL of this server as a path on the dashboard's origin (what the CSP lets it load). */
export function onThisOrigin(url) {
  const parsed = new URL(url, location.href);
  return parsed.pathname + parsed.search;
}

/**
 * The menu items for `file`. `say(message, kind)` reports; `removed(file)` runs after a delete.
 */
export function fileMenuItems(file, { say, removed, details = true }) {
  const name = displayName(file);
  const copy = async (text, what) => {
    const ok = await copyText(text);
    say(ok ? `Copied the ${what} of ${name}: ${text}` : `Copying failed; the ${what} is ${text}`, ok ? 'info' : 'error');
    toast(ok ? `Copied the ${what.replace(/ \(.*\)$/, '')}` : 'Copying failed: see the message at the top',
      ok ? 'info' : 'error');
  };
  const viewUrl = async () => (file.is_public ? file.public_url : (await signFile(file)).url);
  const guarded = (work) => async () => {
    try {
      await work();
    } catch (e) {
      say(e.message, 'error');
    }
  };
  const download = guarded(async () => {
    const href = file.is_public ? file.public_download_url : (await signFile(file)).download_url;
    const link = document.createElement('a');
    link.href = href;
    link.download = name;
    link.rel = 'noopener';
    document.body.append(link);
    link.click();
    link.remove();
  });
  const remove = guarded(async () => {
    if (!await confirmAction(`Delete ${name}? This cannot be undone.`, 'Delete')) return;
    await api('DELETE', `/files/${encodeURIComponent(file.file_id)}`);
    say(`Deleted ${name}.`);
    removed(file);
  });
  const links = file.is_public
    ? [{ label: 'Copy public URL', onSelect: () => copy(file.public_url, 'public URL') },
      { label: 'Copy download URL', onSelect: () => copy(file.public_download_url, 'download URL') },
      { label: 'Copy signed URL', onSelect: guarded(async () => copy((await signFile(file)).url, 'signed URL')) }]
    : [{ label: 'Copy signed URL', onSelect: guarded(async () => copy((await signFile(file)).url, 'signed URL')) },
      { label: 'Copy signed download URL',
        onSelect: guarded(async () => copy((await signFile(file)).download_url, 'signed download URL')) }];
  const copyAs = FORMATS.filter(([format]) => format !== 'url').map(([format, label]) => ({
    label: `Copy as ${label}`,
    onSelect: guarded(async () => copy(snippet(format, file, await viewUrl()),
      `${label}${file.is_public ? '' : ' (a signed link, for 1 hour)'}`)),
  }));
  return [
    details ? { label: 'Open details', onSelect: () => { location.hash = `#/file/${encodeURIComponent(file.file_id)}`; } }
      : undefined,
    { label: 'Download', onSelect: download },
    null, ...links, null, ...copyAs, null,
    { label: 'Delete', onSelect: remove, danger: true },
  ];
}
