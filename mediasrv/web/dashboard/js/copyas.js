// "Copy as": a file's link written for where it is pasted (a README, a web page, a forum).
// Images embed (Markdown image, <img>, [img]); other files become a link with their name.
// Names are escaped for each syntax, since a file name is untrusted text.

export const FORMATS = [['url', 'Link'], ['markdown', 'Markdown'], ['html', 'HTML'], ['bbcode', 'BBCode']];

const isImage = (file) => (file.content_type || '').startsWith('image/');

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

function escapeMarkdown(text) {
  return text.replace(/[\\[\]()*_`<>!]/g, (c) => `\\${c}`);
}

/** A URL inside Markdown's (...): spaces and parentheses would end it early. */
function markdownUrl(url) {
  return url.replace(/[ ()]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** BBCode has no escaping: drop the brackets that would end a tag early. */
function cleanBbcode(text) {
  return text.replace(/[[\]]/g, '');
}

/** The snippet of `format` for `file` reachable at `url` (its public or a signed URL). */
export function snippet(format, file, url) {
  const name = file.name || file.file_id;
  switch (format) {
    case 'markdown':
      return `${isImage(file) ? '!' : ''}[${escapeMarkdown(name)}](${markdownUrl(url)})`;
    case 'html':
      return isImage(file) ? `<img src="${escapeHtml(url)}" alt="${escapeHtml(name)}">`
        : `<a href="${escapeHtml(url)}">${escapeHtml(name)}</a>`;
    case 'bbcode':
      return isImage(file) ? `[img]${cleanBbcode(url)}[/img]` : `[url=${cleanBbcode(url)}]${cleanBbcode(name)}[/url]`;
    default:
      return url;
  }
}
