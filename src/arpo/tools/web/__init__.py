"""The web tools, `web_search` (web_search.py: one tool over the configured provider) and `browse`
(browse.py: fetch a page, show its readable text), with what they share (their settings, `tools.web`,
are arpo/settings/web.py): HTTP manners (webhttp.py: rate limits, retries), where browse may
connect (webnet.py), the capped body decoder (webdecode.py) and page text extraction (pagetext.py,
run in killable workers by extract_worker.py). docs/web_tools.md has the threat model.

Not to be confused with arpo/web/, the local web that `arpo web serve` runs for these tools to read."""
