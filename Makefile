# idemgw build. `make` builds build/idemgw; `make asan` builds build-asan/idemgw with
# AddressSanitizer + UndefinedBehaviorSanitizer; `make check` runs every test; `V=1` shows commands.

PKGS      := libevent libevent_openssl jansson libfyaml libpq sqlite3 openssl zlib libbrotlidec
LLHTTP_SRC ?= /usr/share/llhttp
LLHTTP_INC ?= /usr/share/include/llhttp

BUILD   ?= build
CC      ?= cc
CFLAGS  ?= -O2 -g
WARN    := -Wall -Wextra -Werror -Wno-unused-parameter
CPPFLAGS_ALL := -std=c11 -D_GNU_SOURCE -Iinclude -I$(LLHTTP_INC) $(shell pkg-config --cflags $(PKGS))
LDLIBS_ALL   := $(shell pkg-config --libs $(PKGS)) -lm -pthread
EXTRA_CFLAGS ?=
EXTRA_LDFLAGS ?=

ifeq ($(V),1)
Q :=
else
Q := @
endif

SRCS     := $(wildcard src/*/*.c)
# The migrations in sql/ are compiled in (gen/migrations.c), so the binary needs no sql/ folder;
# those of the embedded store, in sql/sqlite/, likewise (gen/migrations_sqlite.c).
MIGRATIONS := $(sort $(wildcard sql/[0-9]*.sql))
SQLITE_MIGRATIONS := $(sort $(wildcard sql/sqlite/[0-9]*.sql))
OBJS     := $(SRCS:src/%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/migrations.o \
            $(BUILD)/obj/gen/migrations_sqlite.o
LIB_OBJS := $(filter-out $(BUILD)/obj/cmd/main.o,$(OBJS))
LLHTTP_OBJS := $(BUILD)/obj/llhttp/llhttp.o $(BUILD)/obj/llhttp/api.o $(BUILD)/obj/llhttp/http.o

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
# Unit tests may include a folder's private header (stdio_int.h) by its name, wherever it lives.
UNIT_INC  := $(patsubst %/,-I%,$(wildcard src/*/))

.PHONY: all asan clean check layers unit integration bench bench-stdio bench-instructions faults faults-campaign fuzz fuzz-bins fuzz-smoke format deb man package-test image-test coverage sim sim-mutants

all: $(BUILD)/idemgw

$(BUILD)/idemgw: $(OBJS) $(LLHTTP_OBJS)
	@echo "  LD      $@"
	$(Q)$(CC) $(CFLAGS) $(EXTRA_CFLAGS) $(EXTRA_LDFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/obj/%.o: src/%.c $(wildcard include/*.h) | $(BUILD)/obj
	@echo "  CC      $<"
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS_ALL) $(CFLAGS) $(EXTRA_CFLAGS) $(WARN) -MMD -MP -c -o $@ $<

# The operator's page is compiled in by admin_page.c (.incbin, from the top of the tree).
$(BUILD)/obj/ops/admin_page.o: src/ops/admin_page.html

# llhttp ships as generated C sources in Debian's node-llhttp; compiled as is, without our -Werror.
$(BUILD)/obj/llhttp/%.o: $(LLHTTP_SRC)/%.c | $(BUILD)/obj/llhttp
	@echo "  CC      $<"
	$(Q)$(CC) -I$(LLHTTP_INC) $(CFLAGS) $(EXTRA_CFLAGS) -w -c -o $@ $<

# Unit tests link an archive, so each pulls in only the modules it exercises.
$(BUILD)/libidemgw.a: $(LIB_OBJS) $(LLHTTP_OBJS)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/tests/test_%: tests/unit/test_%.c $(wildcard tests/unit/*.h) $(BUILD)/libidemgw.a | $(BUILD)/tests
	@echo "  CC      $<"
	$(Q)$(CC) $(CPPFLAGS_ALL) $(UNIT_INC) $(shell pkg-config --cflags cmocka) $(CFLAGS) $(EXTRA_CFLAGS) $(WARN) \
	    $(EXTRA_LDFLAGS) -o $@ $< $(BUILD)/libidemgw.a $(LDLIBS_ALL) $(shell pkg-config --libs cmocka)

$(BUILD)/gen/migrations.c: $(MIGRATIONS) scripts/embed-sql.sh | $(BUILD)/gen
	@echo "  GEN     $@"
	$(Q)scripts/embed-sql.sh $(MIGRATIONS) >$@.tmp && mv $@.tmp $@

$(BUILD)/gen/migrations_sqlite.c: $(SQLITE_MIGRATIONS) scripts/embed-sql.sh | $(BUILD)/gen
	@echo "  GEN     $@"
	$(Q)scripts/embed-sql.sh --name store_sqlite_migrations $(SQLITE_MIGRATIONS) >$@.tmp && mv $@.tmp $@

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c include/store_migrations.h | $(BUILD)/obj/gen
	@echo "  CC      $<"
	$(Q)$(CC) $(CPPFLAGS_ALL) $(CFLAGS) $(EXTRA_CFLAGS) $(WARN) -c -o $@ $<

$(BUILD)/obj $(BUILD)/obj/llhttp $(BUILD)/tests $(BUILD)/gen $(BUILD)/obj/gen:
	$(Q)mkdir -p $@

-include $(OBJS:.o=.d)

asan:
	$(Q)$(MAKE) BUILD=build-asan CC=clang \
	    EXTRA_CFLAGS="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" all unit-bins

unit-bins: $(UNIT_BINS)

# Unit tests only (test_store skips without IDEMGW_TEST_PG_URL; make check provides one).
unit: unit-bins
	$(Q)for t in $(UNIT_BINS); do $$t || exit 1; done

# The layer order of src/ (ARCHITECTURE.md, "Layers"): fails on an include from a lower folder
# into a higher one.
layers:
	$(Q)scripts/check-layers.sh

# The test command: installs what is missing (fast when nothing is), builds, runs everything.
# Recursive make so the build sees libraries the install step just added.
# `make check TEST=name` runs one test instead, with the same private Postgres: a unit test
# binary (TEST=test_jcs) or an integration file (TEST=proxy or TEST=proxy.test.mjs); TEST=docs
# runs the documentation's checks alone (ARCHITECTURE.md's code map, the config examples, idemgw.5).
check: layers
	$(Q)scripts/install-deps.sh
	$(Q)$(MAKE) --no-print-directory all unit-bins $(if $(TEST),,fuzz-smoke)
	$(Q)tests/run-all.sh $(if $(TEST),--only '$(TEST)')

# Line coverage per src/ folder and in total: a build with --coverage in build-cov/, the unit
# tests run against it, then gcov. COV_INTEGRATION="stdio-upstream proxy" runs those
# integration files too (tests/integration/NAME.test.mjs); COVERAGE_FILES=1 adds each file.
COV_INTEGRATION ?=
coverage:
	$(Q)$(MAKE) --no-print-directory BUILD=build-cov CFLAGS="-O0 -g" EXTRA_CFLAGS="--coverage" \
	    EXTRA_LDFLAGS="--coverage" all unit-bins
	$(Q)scripts/coverage.sh build-cov $(foreach t,$(COV_INTEGRATION),tests/integration/$(t:.test.mjs=).test.mjs)

# The same tests against the sanitizer build.
.PHONY: check-asan
check-asan: asan
	$(Q)BUILD=build-asan IDEMGW_BIN=build-asan/idemgw tests/run-all.sh

bench: all
	$(Q)scripts/bench.sh

# One stdio MCP server behind idemgw (a child per session, one shared) and behind the stdio
# bridges supergateway and mcp-proxy: latency, calls/s, first answer of a new session, memory
# per session. Also a section of `make bench` (BENCH_ONLY=stdio).
bench-stdio: all
	$(Q)scripts/bench/stdio.sh

# Instructions per relayed read, protected first execution and replay under callgrind: a
# figure that does not move with the machine's load, to compare builds (docs/performance.md).
bench-instructions: all
	$(Q)scripts/bench/instructions.sh

# The fault suite: hostile upstreams, Postgres kill -9, a locked key table, EMFILE, slowloris.
# Not part of `make check`: a few minutes of load. FAULTS="emfile slowloris" runs only those.
faults: all
	$(Q)scripts/faults.sh $(FAULTS)

# The long campaign of tests/faults/campaign.mjs: CAMPAIGN_CALLS orders (default 100,000)
# through two gateways under kill -9s and a Postgres failover; its figures go in docs/faults.md.
faults-campaign: all
	$(Q)CAMPAIGN_CALLS=$${CAMPAIGN_CALLS:-100000} scripts/faults.sh campaign

# The deterministic simulator (tests/sim, docs/simulator.md): gateways, the embedded store,
# agents and upstreams under one seeded PRNG and a simulated clock, with faults; the invariants
# checked after every step. SIM_SEED=N replays a run, SIM_CALLS=N sets its length.
# `make sim-mutants` plants each bug of tests/sim/mutants/ in a copy of the tree and expects
# the simulator to catch it.
SIM_SRCS := $(wildcard tests/sim/*.c)

$(BUILD)/sim: $(SIM_SRCS) tests/sim/sim.h $(BUILD)/libidemgw.a
	@echo "  LD      $@"
	$(Q)$(CC) $(CPPFLAGS_ALL) $(CFLAGS) $(EXTRA_CFLAGS) $(WARN) $(EXTRA_LDFLAGS) -o $@ \
	    $(SIM_SRCS) $(BUILD)/libidemgw.a $(LDLIBS_ALL)

sim: $(BUILD)/sim
	$(Q)$(BUILD)/sim $(if $(SIM_SEED),--seed $(SIM_SEED)) $(if $(SIM_CALLS),--calls $(SIM_CALLS))

sim-mutants:
	$(Q)scripts/sim-mutants.sh

# libFuzzer drivers (tests/fuzz/fuzz_*.c), one per parser that reads network or operator bytes.
# `make fuzz` fuzzes each for FUZZ_SECONDS on a scratch copy of its seed corpus;
# `make fuzz-smoke` only replays the seeds, so the drivers keep building and passing.
FUZZ_SECONDS ?= 30
FUZZ_BINS := $(patsubst tests/fuzz/%.c,build-fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))

fuzz-bins:
	$(Q)$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang \
	    EXTRA_CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined" \
	    build-fuzz/libidemgw.a $(FUZZ_BINS)

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c build-fuzz/libidemgw.a
	@echo "  FUZZ    $@"
	$(Q)clang $(CPPFLAGS_ALL) -O1 -g -fsanitize=fuzzer,address,undefined -o $@ $< \
	    build-fuzz/libidemgw.a $(LDLIBS_ALL)

fuzz: fuzz-bins
	$(Q)for f in $(FUZZ_BINS); do n=$${f#build-fuzz/fuzz_}; rm -rf build-fuzz/corpus-$$n; \
	    mkdir -p build-fuzz/corpus-$$n && cp tests/fuzz/corpus/$$n/* build-fuzz/corpus-$$n/ && \
	    $$f -max_total_time=$(FUZZ_SECONDS) -max_len=8192 build-fuzz/corpus-$$n || exit 1; done

fuzz-smoke: fuzz-bins
	$(Q)for f in $(FUZZ_BINS); do n=$${f#build-fuzz/fuzz_}; \
	    $$f -runs=0 tests/fuzz/corpus/$$n >/dev/null 2>&1 || { echo "fuzz seed failure: $$f"; \
	    $$f -runs=0 tests/fuzz/corpus/$$n; exit 1; }; echo "  fuzz seeds ok: $$n"; done

format:
	$(Q)clang-format -i src/*/*.c src/*/*.h include/*.h tests/unit/*.c

clean:
	rm -rf build build-asan build-fuzz build-cov

# The man page of the configuration, idemgw.5, made from docs/configuration.md (`make man`;
# `man -l build/idemgw.5` reads it). idemgw.8 is written by hand in conf/.
man: $(BUILD)/idemgw.5

$(BUILD)/idemgw.5: docs/configuration.md scripts/man-config.sh src/cmd/main.c
	@echo "  MAN     $@"
	@mkdir -p $(BUILD)
	$(Q)scripts/man-config.sh docs/configuration.md >$@.tmp && mv $@.tmp $@

# The Debian package (build/deb/idemgw_VERSION_ARCH.deb): binary, /etc/idemgw/idemgw.yaml,
# systemd unit, the man pages idemgw.8 and idemgw.5.
deb: all $(BUILD)/idemgw.5
	$(Q)scripts/make-deb.sh

# Installs that package on this machine and checks it (root; not part of `make check`).
package-test: all
	$(Q)scripts/package-test.sh

# Builds the container image on a debootstrapped Debian 12 base and runs it with podman.
image-test:
	$(Q)scripts/image-test.sh
