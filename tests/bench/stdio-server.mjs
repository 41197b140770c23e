// The stdio MCP server of `make bench-stdio` (scripts/bench/stdio.sh): the official SDK's
// McpServer over StdioServerTransport, the same program behind idemgw and behind each bridge.
//
// Tools:
//   append  non-idempotent (destructiveHint): appends `item` to a list kept in memory,
//           answers "appended #N" (N: the list's length in this process)
//   get     read-only: answers the list's length and the item at `index` (the last by default)
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { z } from 'zod';

const items = [];
const text = (s) => ({ content: [{ type: 'text', text: s }] });

const server = new McpServer({ name: 'bench-stdio', version: '1.0.0' });

server.registerTool(
  'append',
  {
    description: 'Appends an item to the list',
    inputSchema: { item: z.string() },
    annotations: { readOnlyHint: false, idempotentHint: false, destructiveHint: true },
  },
  async ({ item }) => {
    items.push(item);
    return text(`appended #${items.length}`);
  },
);

server.registerTool(
  'get',
  {
    description: 'Reads the list: its length and one item',
    inputSchema: { index: z.number().int().optional() },
    annotations: { readOnlyHint: true },
  },
  async ({ index }) => {
    const i = index ?? items.length - 1;
    return text(`${items.length} items; [${i}] = ${items[i] ?? '-'}`);
  },
);

await server.connect(new StdioServerTransport());
