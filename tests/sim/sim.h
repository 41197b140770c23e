/* The deterministic simulator (make sim): several gateways (the real idempotency stage, each
 * over its own handle of one real SQLite store file), agents and upstreams played by the
 * simulator, one seeded PRNG choosing every event, a simulated clock, faults injected below
 * SQLite (sim_vfs.c) and at the store's interface (sim_store.c). Shared between its files. */
#ifndef IDEMGW_SIM_H
#define IDEMGW_SIM_H

#include "exchange.h"
#include "store.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- the PRNG (sim.c): every choice of a run comes from it ---- */
uint64_t sim_rand(void);
/* 0 .. n-1 */
uint64_t sim_below(uint64_t n);
/* true with probability num/den */
bool sim_chance(uint64_t num, uint64_t den);

/* ---- the clock (sim.c) ---- */
uint64_t sim_wall_ms(void);

/* ---- the exchange (sim_exchange.c): what exchange.h promises, played by the simulator ---- */
struct sim_attempt;
/* A protected call's request: a POST with body, its headers (name, value, ... NULL). */
exchange_t *sim_exchange_new(struct sim_attempt *att, const char *body, const char *const *hdrs);
struct sim_attempt *sim_exchange_attempt(const exchange_t *ex);
/* The agent stopped waiting (timed out, or its connection broke). */
void sim_exchange_leave(exchange_t *ex);
/* The upstream's answer, played to the observers: head, body, end. */
observe_t sim_exchange_head(exchange_t *ex, int status, const char *content_type);
observe_t sim_exchange_body(exchange_t *ex, const char *data, size_t len);
observe_t sim_exchange_end(exchange_t *ex, int upstream_result);
/* The exchange is over for the simulator: the observers' last call. */
void sim_exchange_detach(exchange_t *ex);
void sim_exchange_free(exchange_t *ex);
bool sim_exchange_forwarded(const exchange_t *ex);
/* What reached the agent: NULL while nothing did. ended: closed without an answer. */
const char *sim_exchange_answer(const exchange_t *ex, bool *ended);

/* Told by the exchange (sim.c). */
void sim_on_forward(exchange_t *ex);
void sim_on_answer(exchange_t *ex);

/* ---- the store shim (sim_store.c) ---- */
typedef struct sim_gate sim_gate_t;
/* A gateway's store: the real one behind a table that runs one operation at a time, in the
 * order every gateway issued them (the simulator's order, whatever the writer threads do). */
store_t *sim_gate_new(int gw, store_t *real, sim_gate_t **out);
/* The gateway died: nothing it asked is answered any more; frees its real store. */
void sim_gate_kill(sim_gate_t *g);
/* Runs queued operations until none is left, with the event loop. */
void sim_gates_settle(struct event_base *base);
/* Operations waiting across gateways. */
int sim_gates_queued(void);
/* The operator's `idemgw key --release` of key through g; done(arg, released, state before). */
void sim_gate_release(sim_gate_t *g, const char *key,
                      void (*done)(void *arg, bool released, bool had_row, store_state_t was),
                      void *arg);

/* What the shim saw committed, for the model (sim.c). att: the call's attempt, or NULL. */
void sim_on_claim(struct sim_attempt *att, const char *key, bool acquired, int64_t fence);
void sim_on_finish(struct sim_attempt *att, const char *key, int64_t fence, store_state_t state,
                   bool matched, uint64_t window_ms);
/* The attempt a gateway handles now (a store call belongs to it); sets a, returns the one
 * before. */
struct sim_attempt *sim_swap_current(struct sim_attempt *a);
/* The gateway dies (a kill, or the machine's power loss); a fault counted by kind. */
void sim_gateway_dies(int gw);
void sim_count_fault(const char *what);

/* ---- faults below SQLite (sim_vfs.c) ---- */
typedef enum {
    SIM_FAULT_NONE = 0,
    SIM_FAULT_WRITE, /* the next write fails (EIO) */
    SIM_FAULT_SYNC,  /* the next fsync fails */
    SIM_FAULT_TORN,  /* the next write lands half and fails */
} sim_fault_t;
/* Installs the fault VFS under every store file (as "unix", wrapping the system's). */
void sim_vfs_install(void);
/* Arms one fault for the next operation; sim_vfs_fired says whether it hit. */
void sim_vfs_arm(sim_fault_t f);
bool sim_vfs_disarm(void);
/* The machine stops: nothing reaches the disk until sim_vfs_reboot, which then drops or tears
 * what was written since each file's last fsync (as a power loss may). */
void sim_vfs_power_off(void);
void sim_vfs_reboot(void);

#endif
