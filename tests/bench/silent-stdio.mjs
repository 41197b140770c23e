// A stdio MCP server that never answers: it says on stderr that it started and then reads its
// stdin forever without writing a line to stdout, as a server stuck at startup does (a registry
// it cannot reach, a lock it waits for). `make bench-stdio`'s failure class (b).
process.stderr.write('silent-stdio: started; waiting for a licence server that never answers\n');
process.stdin.on('data', () => {});
process.stdin.on('end', () => {}); // a closed stdin does not end it either; a signal does
setInterval(() => {}, 60_000);
