// What can be done with one file from the gallery (a card's menu, the lightbox): open its page,
// download it, copy its links, copy it as Markdown / HTML / BBCode, rename it, make it public or
// private, delete it. A private file's links are signed URLs made on demand (one hour), so the
// session token never goes in a URL. Renaming and visibility are PATCH /files/{id} with `name`
// or `is_public`; the file view (views/file.js) uses the same helpers for its own form.
import { api } from './api.js';
import { FORMATS, snippet } from './copyas.js';
import { busy, confirmAction, copyText, errorBox, field, h } from './dom.js';
import { toast } from './toast.js';

const SIGNED_FOR_S = 3600;

export const displayName = (file) => file.name || file.file_id;

/** A signed view and download URL of a file ({url, download_url, expires_at}). */
export function signFile(file, expiresIn = SIGNED_FOR_S) {
  return api('POST', `/files/${encodeURIComponent(file.file_id)}/signed-url`, { json: { expires_in: expiresIn } });
}

/** PATCH /files/{id} with `changes` ({name} or {is_public}): resolves the File as it is now. */
export function updateFile(file, changes) {
  return api('PATCH', `/files/${encodeURIComponent(file.file_id)}`, { json: changes });
}

/**
 * The name to send for what was typed: without the spaces around it (pasted by accident, and
 * invisible in a list); nothing at all is no name (null), which the API allows: the file is then
 * shown by its id. Anything else is the server's to refuse (INVALID_FILE_NAME), with its reason.
 */
export function nameToSend(typed) {
  const name = typed.trim();
  return name || null;
}

export const NAME_HINT = 'Up to 255 characters. Leave it empty to remove the name: the file id shows instead.';

/** What a rename did, in words. */
export function renamedWords(before, file) {
  return file.name ? `Renamed ${before} to ${file.name}.` : `Removed the name of ${before}: it shows as ${file.file_id}.`;
}

/** What a visibility change did, in words. */
export function visibilityWords(file) {
  const name = displayName(file);
  return file.is_public ? `${name} is public: anyone with its link can open it.`
    : `${name} is private: its public link no longer opens it; signed links still do.`;
}

/** Show the server's refusal of what `input` holds under it (`box`: an errorBox) and go back to it. */
export function refuseInput(input, box, message) {
  box.show(message);
  input.setAttribute('aria-invalid', 'true');
  input.setAttribute('aria-describedby', [input.dataset.hint, box.el.id].filter(Boolean).join(' '));
  input.focus();
}

/** Clear what refuseInput showed. */
export function acceptInput(input, box) {
  box.clear();
  input.removeAttribute('aria-invalid');
  if (input.dataset.hint) input.setAttribute('aria-describedby', input.dataset.hint);
  else input.removeAttribute('aria-describedby');
}

let renames = 0;

/** The name field of a rename form: prefilled, described by the hint, and the error box under it. */
export function nameField(file) {
  renames += 1;
  const hintId = `name-hint-${renames}`;
  const named = field('File name', { type: 'text', value: file.name || '', autocomplete: 'off', spellcheck: 'false',
    'aria-describedby': hintId, dataset: { hint: hintId } });
  named.input.classList.add('name-input');
  const error = errorBox();
  error.el.id = `name-error-${renames}`;
  return { wrap: named.wrap, input: named.input, error, hint: h('p', { class: 'muted hint', id: hintId }, NAME_HINT) };
}

/**
 * Ask for a new name of `file` in a modal dialog, which sends it (PATCH): a name the server
 * refuses is said in the dialog, its message under the field, to correct or cancel. Escape or
 * Cancel close it without a change. Resolves the File renamed, or null when nothing changed.
 */
export function renameDialog(file) {
  const named = nameField(file);
  const titleId = `${named.error.el.id}-title`;
  const cancel = h('button', { type: 'button' }, 'Cancel');
  const form = h('form', { class: 'stack' },
    h('h2', { id: titleId }, `Rename ${displayName(file)}`),
    named.wrap, named.hint, named.error.el,
    h('div', { class: 'row dialog-buttons' }, cancel, h('button', { type: 'submit', class: 'primary' }, 'Save name')));
  const dialog = h('dialog', { class: 'form-dialog', 'aria-labelledby': titleId }, form);
  let saving = false;
  let renamed = null;
  cancel.addEventListener('click', () => dialog.close());
  dialog.addEventListener('cancel', (event) => {
    if (saving) event.preventDefault(); // Escape while the name is on its way: its answer decides
  });
  named.input.addEventListener('input', () => acceptInput(named.input, named.error));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    if (saving) return;
    acceptInput(named.input, named.error);
    const name = nameToSend(named.input.value);
    if (name === (file.name || null)) {
      dialog.close(); // unchanged: nothing to send
      return;
    }
    saving = true;
    try {
      renamed = await busy(form, () => updateFile(file, { name }));
      dialog.close();
    } catch (e) {
      refuseInput(named.input, named.error, e.message);
    } finally {
      saving = false;
    }
  });
  document.body.append(dialog);
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(renamed);
    }, { once: true });
    dialog.showModal();
    // The name without its extension selected, ready to type over (as a file manager does).
    const dot = named.input.value.lastIndexOf('.');
    named.input.focus();
    named.input.setSelectionRange(0, dot > 0 ? dot : named.input.value.length);
  });
}

/** A URL of this server as a path on the dashboard's origin (what the CSP lets it load). */
export function onThisOrigin(url) {
  const parsed = new URL(url, location.href);
  return parsed.pathname + parsed.search;
}

/**
 * The menu items for `file`. `say(message, kind)` reports; `removed(file)` runs after a delete;
 * `changed(file)` after a rename or a visibility change, with the File as it is now (without it,
 * the menu offers neither).
 */
export function fileMenuItems(file, { say, removed, changed = null, details = true }) {
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
  const done = (message, updated) => {
    say(message);
    toast(message);
    changed(updated);
  };
  const rename = guarded(async () => {
    const renamed = await renameDialog(file);
    if (renamed) done(renamedWords(name, renamed), renamed);
  });
  const switchVisibility = guarded(async () => {
    const updated = await updateFile(file, { is_public: !file.is_public });
    done(visibilityWords(updated), updated);
  });
  const manage = changed ? [null, { label: 'Rename…', onSelect: rename },
    { label: file.is_public ? 'Make private' : 'Make public', onSelect: switchVisibility }] : [];
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
    null, ...links, null, ...copyAs, ...manage, null,
    { label: 'Delete', onSelect: remove, danger: true },
  ];
}
