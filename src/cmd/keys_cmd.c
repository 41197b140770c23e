/* `idemgw keys` (src/cmd/keys_cmd.h). */
#include "keys_cmd.h"
#include "store_cli.h"

#include "config.h"
#include "store_queue.h"
#include "util.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS_EXIT_USAGE 2

typedef enum { KEYS_LIST, KEYS_SHOW, KEYS_RESOLVE } keys_verb_t;

typedef struct keys_run {
    store_cli_run_t run; /* first: store_cli hands it back */
    keys_verb_t verb;
    store_queue_filter_t filter;
    store_queue_resolve_t resolve;
    const char *hash;
    bool json;
} keys_run_t;

static void usage(FILE *f)
{
    fputs("usage: idemgw keys list [--state unknown|stuck|open|in_progress|succeeded|failed]\n"
          "                        [--server NAME] [--tool T] [--subject S] [--limit N]\n"
          "                        [--cursor C] [--json]\n"
          "       idemgw keys show HASH\n"
          "       idemgw keys resolve HASH (--succeeded --result-file F | --failed | --forget)\n"
          "                        [--note TEXT] [--by NAME]\n"
          "each with [-c FILE] [--database-url URL]\n",
          f);
}

static void print_json(const json_t *j)
{
    char *t = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("%s\n", t ? t : "null");
    free(t);
}

static const char *str_or(const json_t *o, const char *name, const char *dflt)
{
    const char *v = json_string_value(json_object_get(o, name));
    return v ? v : dflt;
}

static void answered(store_status_t st, store_queue_answer_t a, const json_t *body, void *arg)
{
    keys_run_t *k = arg;
    if (store_cli_failed(&k->run, st, "the store call")) {
        store_cli_done(&k->run);
        return;
    }
    if (a != STORE_QUEUE_OK) {
        fprintf(stderr, "%s: %s%s%s\n", k->run.cmd, str_or(body, "message", "failed"),
                json_object_get(body, "state") ? "; its state is " : "", str_or(body, "state", ""));
        k->run.rc = a == STORE_QUEUE_INVALID ? KEYS_EXIT_USAGE : 1;
        store_cli_done(&k->run);
        return;
    }
    if (k->verb == KEYS_LIST && !k->json) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(body, "keys"), i, e)
        {
            const char *server = str_or(e, "server", NULL);
            printf("%s  %-11s  %s%s%s  %s  %s  attempts=%lld\n", str_or(e, "key_hash", ""),
                   str_or(e, "state", ""), server ? server : "", server ? "/" : "",
                   str_or(e, "tool", ""), str_or(e, "subject", ""), str_or(e, "first_seen", ""),
                   (long long)json_integer_value(json_object_get(e, "attempts")));
        }
        const char *next = str_or(body, "next", NULL);
        if (next)
            fprintf(stderr, "%s: more keys: --cursor %s\n", k->run.cmd, next);
    } else {
        print_json(body);
    }
    k->run.rc = fflush(stdout) == 0 ? 0 : STORE_CLI_EXIT_FAILED;
    store_cli_done(&k->run);
}

static store_status_t keys_call(store_t *store, store_cli_run_t *run)
{
    keys_run_t *k = (keys_run_t *)run;
    switch (k->verb) {
    case KEYS_LIST:
        return store_queue_list(store, &k->filter, answered, k);
    case KEYS_SHOW:
        return store_queue_show(store, k->hash, answered, k);
    case KEYS_RESOLVE:
        return store_queue_resolve(store, &k->resolve, answered, k);
    }
    return STORE_ERR_STATEMENT;
}

int keys_cmd_main(int argc, char **argv)
{
    enum {
        O_STATE = 256,
        O_SERVER,
        O_TOOL,
        O_SUBJECT,
        O_LIMIT,
        O_CURSOR,
        O_JSON,
        O_DB,
        O_SUCCEEDED,
        O_FAILED,
        O_FORGET,
        O_RESULT,
        O_NOTE,
        O_BY
    };
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"database-url", required_argument, NULL, O_DB},
        {"state", required_argument, NULL, O_STATE},
        {"server", required_argument, NULL, O_SERVER},
        {"tool", required_argument, NULL, O_TOOL},
        {"subject", required_argument, NULL, O_SUBJECT},
        {"limit", required_argument, NULL, O_LIMIT},
        {"cursor", required_argument, NULL, O_CURSOR},
        {"json", no_argument, NULL, O_JSON},
        {"succeeded", no_argument, NULL, O_SUCCEEDED},
        {"failed", no_argument, NULL, O_FAILED},
        {"forget", no_argument, NULL, O_FORGET},
        {"result-file", required_argument, NULL, O_RESULT},
        {"note", required_argument, NULL, O_NOTE},
        {"by", required_argument, NULL, O_BY},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? KEYS_EXIT_USAGE : 0;
    }
    keys_run_t k = {.run = {.cmd = "idemgw keys", .call = keys_call}};
    const char *verb = argv[1];
    if (strcmp(verb, "list") == 0)
        k.verb = KEYS_LIST;
    else if (strcmp(verb, "show") == 0)
        k.verb = KEYS_SHOW;
    else if (strcmp(verb, "resolve") == 0)
        k.verb = KEYS_RESOLVE;
    else {
        fprintf(stderr, "idemgw keys: unknown command %s\n", verb);
        usage(stderr);
        return KEYS_EXIT_USAGE;
    }
    const char *config = NULL, *state = NULL, *result_file = NULL;
    int outcomes = 0;
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, ":c:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case O_DB:
            k.run.database_url = optarg;
            break;
        case O_STATE:
            state = optarg;
            break;
        case O_SERVER:
            k.filter.server = optarg;
            break;
        case O_TOOL:
            k.filter.tool = optarg;
            break;
        case O_SUBJECT:
            k.filter.subject = optarg;
            break;
        case O_LIMIT: {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end || n < 1 || n > STORE_QUEUE_LIMIT_MAX) {
                fprintf(stderr, "idemgw keys list: --limit is 1 to %d\n", STORE_QUEUE_LIMIT_MAX);
                return KEYS_EXIT_USAGE;
            }
            k.filter.limit = (int)n;
            break;
        }
        case O_CURSOR:
            k.filter.cursor = optarg;
            break;
        case O_JSON:
            k.json = true;
            break;
        case O_SUCCEEDED:
        case O_FAILED:
        case O_FORGET:
            k.resolve.outcome = c == O_SUCCEEDED ? STORE_QUEUE_SUCCEEDED
                                : c == O_FAILED  ? STORE_QUEUE_FAILED
                                                 : STORE_QUEUE_FORGET;
            outcomes++;
            break;
        case O_RESULT:
            result_file = optarg;
            break;
        case O_NOTE:
            k.resolve.note = optarg;
            break;
        case O_BY:
            k.resolve.actor = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            fprintf(stderr, "idemgw keys: bad option %s\n", argv[optind - 1]);
            usage(stderr);
            return KEYS_EXIT_USAGE;
        }
    }
    if (k.verb != KEYS_LIST) {
        if (optind != argc - 1) {
            fprintf(stderr, "idemgw keys %s: give one key_hash (or a unique prefix of it)\n", verb);
            return KEYS_EXIT_USAGE;
        }
        k.hash = argv[optind];
        k.resolve.key_hash = k.hash;
    } else if (optind != argc) {
        fprintf(stderr, "idemgw keys list: unexpected argument %s\n", argv[optind]);
        return KEYS_EXIT_USAGE;
    }
    if (!store_queue_state_parse(state, &k.filter.state)) {
        fprintf(stderr, "idemgw keys list: --state is one of unknown, stuck, open, in_progress, "
                        "succeeded, failed\n");
        return KEYS_EXIT_USAGE;
    }
    json_t *result = NULL;
    if (k.verb == KEYS_RESOLVE) {
        if (outcomes != 1) {
            fprintf(stderr, "idemgw keys resolve: give one of --succeeded, --failed, --forget\n");
            return KEYS_EXIT_USAGE;
        }
        if ((k.resolve.outcome == STORE_QUEUE_SUCCEEDED) != (result_file != NULL)) {
            fprintf(stderr, "idemgw keys resolve: --succeeded needs --result-file F (the "
                            "CallToolResult retries replay), and only it takes one\n");
            return KEYS_EXIT_USAGE;
        }
        if (result_file) {
            json_error_t err;
            result = json_load_file(result_file, 0, &err);
            if (!json_is_object(result)) {
                fprintf(stderr, "idemgw keys resolve: %s: not a JSON object (%s)\n", result_file,
                        result ? "another JSON value" : err.text);
                json_decref(result);
                return KEYS_EXIT_USAGE;
            }
            k.resolve.result = result;
        }
        if (!k.resolve.actor)
            k.resolve.actor = getenv("USER");
    }
    config_t *cfg = NULL;
    if (config) {
        config_errors_t errs = {0};
        cfg = config_load(config, &errs);
        for (size_t i = 0; !cfg && i < errs.n; i++)
            fprintf(stderr, "%s\n", errs.msgs[i]);
        config_errors_free(&errs);
        if (!cfg) {
            json_decref(result);
            return KEYS_EXIT_USAGE;
        }
    }
    int rc = store_cli_exec(cfg, &k.run);
    if (cfg)
        config_free(cfg);
    json_decref(result);
    return rc;
}
