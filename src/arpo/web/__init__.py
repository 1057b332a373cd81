"""The local web: a corpus served as HTML pages with a SearXNG-compatible search API (`arpo web
serve`, server.py over site.py), so the web tools (tools/web/web_search.py, tools/web/browse.py) run offline
exactly as on the internet; and deep-search SFT trajectories made through those tools (sft/web.py)."""
