// What the stdio benchmarks read from /proc: a process's descendants, their memory, whether a
// pid is still a running process (a zombie is not), and which of a tree run a given program.
import fs from 'node:fs';

function statFields(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  // after "pid (comm) ": state, ppid, pgrp, session, ...
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** pid and every process below it, parents before children. */
export function descendants(pid) {
  const kids = new Map();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    let ppid;
    try {
      ppid = Number(statFields(d)[1]);
    } catch {
      continue; // exited while we looked
    }
    if (!kids.has(ppid)) kids.set(ppid, []);
    kids.get(ppid).push(Number(d));
  }
  const out = [pid];
  for (let i = 0; i < out.length; i++) out.push(...(kids.get(out[i]) ?? []));
  return out;
}

const kibField = (text, name) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, 'm').exec(text)?.[1] ?? 0);

/** {rss_kib, pss_kib, procs} over pid and its descendants. */
export function treeMemory(pid) {
  let rss = 0;
  let pss = 0;
  let procs = 0;
  for (const p of descendants(pid)) {
    try {
      rss += kibField(fs.readFileSync(`/proc/${p}/status`, 'utf8'), 'VmRSS');
      pss += kibField(fs.readFileSync(`/proc/${p}/smaps_rollup`, 'utf8'), 'Pss');
      procs++;
    } catch {
      // exited between the listing and the read
    }
  }
  return { rss_kib: rss, pss_kib: pss, procs };
}

/** True while pid is a process that has not exited (a zombie waiting to be reaped has). */
export function running(pid) {
  try {
    return statFields(pid)[0] !== 'Z';
  } catch {
    return false;
  }
}

/**
 * The processes below pid whose command line names `needle` (their program or script); pid
 * itself is left out (a bridge's own arguments name the server it runs).
 */
export function treeRunning(pid, needle) {
  return descendants(pid).slice(1).filter((p) => {
    try {
      const argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      // a shell that runs the command line (`sh -c "node x.mjs"`) is not the server
      return running(p) && !/(^|\/)(ba|da)?sh$/.test(argv[0]) && argv.some((a) => a.includes(needle));
    } catch {
      return false;
    }
  });
}
