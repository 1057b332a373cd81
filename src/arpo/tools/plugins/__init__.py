"""How your own tools join the agent's: plain Python functions and classes (`module.path:name`,
function.py) and the tools of MCP servers (mcp.py). Both give Tools of the protocol in tools/base.py."""
