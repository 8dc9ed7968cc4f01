"""simrun's MCP bridge."""
