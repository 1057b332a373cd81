"""`arpo view`: a local web page for a run's training curves, rollout trees and entropy after tool
results. data.py reads runs on demand, server.py serves them (FastAPI), export.py writes a static
site, static/ is the page (hand-written JS and inline SVG; nothing from a CDN, no build step)."""
