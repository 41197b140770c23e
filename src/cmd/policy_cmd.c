/* The `idemgw policy` subcommand (see src/cmd/policy_cmd.h). */
#include "policy_cmd.h"

#include "catalog.h"
#include "catalog_fetch.h"
#include "config.h"
#include "log.h"
#include "server_arg.h"
#include "util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_FOUND 1
#define EXIT_USAGE 2
#define DESCRIPTION_MAX 110 /* characters of a description shown in a comment */

static void usage(FILE *f)
{
    fputs("usage: idemgw policy init --upstream URL [-H 'Name: value']...\n"
          "       idemgw policy init -- CMD ARGS...      (a stdio server: started once)\n"
          "       idemgw policy init -c FILE --server NAME [-H 'Name: value']...\n"
          "       idemgw policy diff [-c FILE] [--server NAME] [-H 'Name: value']...\n"
          "  init  prints a starter config: every tool the server lists, with the class its\n"
          "        annotations suggest and its description as a comment; with --server, the\n"
          "        tools: of that server of FILE's servers:, indented to go under its entry\n"
          "  diff  tools in the policy but not on the server, on the server but not in the\n"
          "        policy, and classes the server's annotations contradict (exit 1 if any);\n"
          "        classes stricter than the annotations are said too (exit 0); with\n"
          "        servers:, of the server --server names, against its policy\n"
          "  -H    a header for the upstream, e.g. 'Authorization: Bearer ...' (repeatable)\n",
          f);
}

/* --- init --- */

/* The tools of every page, in the server's order. */
typedef struct pages {
    json_t *tools;
} pages_t;

static void keep_page(void *arg, const char *result, size_t len)
{
    pages_t *p = arg;
    json_t *r = json_loadb(result, len, 0, NULL);
    json_t *tools = json_object_get(r, "tools");
    if (json_is_array(tools))
        json_array_extend(p->tools, tools);
    json_decref(r);
}

/* A one-line comment text: control characters as spaces, cut at max characters (UTF-8 kept
 * whole). */
static void comment_text(const char *in, char *out, size_t outlen, size_t max)
{
    size_t o = 0, chars = 0;
    for (const unsigned char *s = (const unsigned char *)(in ? in : ""); *s && o + 5 < outlen;) {
        if ((*s & 0xc0) != 0x80 && ++chars > max) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        out[o++] = *s < 0x20 || *s == 0x7f ? ' ' : (char)*s;
        s++;
    }
    out[o] = '\0';
}

/* A tool name as a YAML key: plain when it is safe so, else double-quoted (JSON escaping). */
static void yaml_key(const char *name, char *out, size_t outlen)
{
    bool plain = *name && strchr("-?:,[]{}#&*!|>'\"%@`", *name) == NULL;
    for (const char *s = name; *s && plain; s++)
        plain = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                *s == '_' || *s == '-' || *s == '.' || *s == '/';
    if (plain) {
        snprintf(out, outlen, "%s", name);
        return;
    }
    json_t *j = json_string(name);
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
    snprintf(out, outlen, "%s", q ? q : "\"\"");
    free(q);
    json_decref(j);
}

static void hints_text(const json_t *ann, char *out, size_t outlen)
{
    static const char *const names[] = {"readOnlyHint", "destructiveHint", "idempotentHint",
                                        "openWorldHint"};
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        const json_t *v = json_object_get(ann, names[i]);
        if (!json_is_boolean(v))
            continue;
        o += (size_t)snprintf(out + o, outlen - o, "%s%s: %s", o ? ", " : "", names[i],
                              json_is_true(v) ? "true" : "false");
        if (o >= outlen)
            break;
    }
    if (!out[0])
        snprintf(out, outlen, "none (MCP reads that as: may write, may destroy, not idempotent)");
}

/* Prints the tools: block of a starter policy, each line after ind (the snippet of a server
 * goes under its entry of servers:). */
static void print_tools(const json_t *tools, catalog_t *catalog, const char *ind)
{
    printf("%stools:\n", ind);
    size_t i;
    json_t *t;
    size_t listed = 0;
    json_array_foreach(tools, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!name || !*name)
            continue;
        class_source_t src;
        tool_class_t cls = catalog_classify(catalog, name, &src);
        char key[400], desc[600], hints[300], shown[200];
        yaml_key(name, key, sizeof(key));
        comment_text(json_string_value(json_object_get(t, "description")), desc, sizeof(desc),
                     DESCRIPTION_MAX);
        hints_text(json_object_get(t, "annotations"), hints, sizeof(hints));
        comment_text(name, shown, sizeof(shown), 100);
        bool usable = strlen(name) <= 256 && !strpbrk(name, " \t\r\n");
        if (desc[0])
            printf("%s  # %s\n", ind, desc);
        printf("%s  # annotations: %s\n", ind, hints);
        if (!usable) {
            printf("%s  # (\"%s\" cannot be named in a policy: a tool name has no spaces)\n\n", ind,
                   shown);
            continue;
        }
        printf("%s  %s:\n%s    class: %s\n\n", ind, key, ind, tool_class_name(cls));
        listed++;
    }
    if (listed == 0)
        printf("%s  {}\n", ind);
}

/* Reads cfg's upstream's tools and prints a starter policy for them: a whole config (its
 * upstream: written as upstream_yaml, the YAML after "upstream:"), or with server (a view of
 * path's servers:) the tools: of its entry. The classes are what the annotations suggest under
 * the built-in defaults, as for a new config. */
static int init(const config_t *cfg, const char *upstream_yaml, const char *path,
                const char *server, const char *headers, const char *add_pass_env)
{
    const char *url = cfg->upstream_url; /* a stdio server's: its command line */
    pages_t pages = {.tools = json_array()};
    catalog_t *catalog = catalog_new();
    policy_t fresh = {0}; /* no tools of the config's: the annotations speak */
    policy_defaults_init(&fresh.defaults);
    catalog_set_policy(catalog, server ? &fresh : &cfg->policy);
    char err[2048]; /* a stdio server's stderr lines too */
    int rc = EXIT_FOUND;
    if (catalog_fetch_now(cfg, headers, catalog, keep_page, &pages, err, sizeof(err)) < 0) {
        fprintf(stderr, "idemgw policy init: %s%s%s%s: %s\n", server ? "server " : "",
                server ? server : "", server ? ", " : "", url, err);
        goto out;
    }
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d", gmtime(&now));
    if (server) {
        printf(
            "# idemgw policy for server %s (%s), from its tools/list\n"
            "# (idemgw policy init --server %s, %s). These lines go under servers: %s: in\n"
            "#   %s\n"
            "# in place of the entry's tools: (they are indented for it). Each class below is\n"
            "# what the tool's annotations suggest. Review every one: a tool with a side effect\n"
            "# that must not happen twice (a payment, a message, an append) belongs in\n"
            "# non_idempotent, whatever the server says. A tool not listed gets the entry's\n"
            "# defaults: (else the top level's). Check the file: idemgw --check-config -c FILE\n",
            server, url, server, when, server, path);
        if (add_pass_env)
            printf(
                "    # The entry's upstream does not pass these variables of this environment on;\n"
                "    # a command that fetches its package first (npx -y, uvx) needs them to\n"
                "    # reach its registry, as it did for the tools below. Add them to its\n"
                "    # upstream's pass_env (names only: the values stay in the environment):\n"
                "    #   pass_env: [%s]\n",
                add_pass_env);
        print_tools(pages.tools, catalog, "    ");
    } else {
        printf(
            "# idemgw policy for %s, from its tools/list (idemgw policy init, %s).\n"
            "# Each class below is what the tool's annotations suggest. Review every one: a tool\n"
            "# with a side effect that must not happen twice (a payment, a message, an append)\n"
            "# belongs in non_idempotent, whatever the server says. The full reference of every\n"
            "# setting is conf/idemgw.yaml; check this file with: idemgw --check-config -c FILE\n"
            "upstream:%s\n"
            "\n"
            "defaults:\n"
            "  # A tool not listed below: non_idempotent, unless its annotations say otherwise.\n"
            "  class: non_idempotent\n"
            "  window: 10m\n"
            "\n",
            url, when, upstream_yaml);
        print_tools(pages.tools, catalog, "");
    }
    rc = fflush(stdout) == 0 ? 0 : EXIT_FOUND;
out:
    json_decref(pages.tools);
    catalog_free(catalog);
    policy_free(&fresh);
    return rc;
}

/* init --upstream URL or -- CMD ARGS: a config of that upstream alone (upstream_yaml, what
 * follows "upstream:"). */
static int init_upstream(const char *what, const char *upstream_yaml, const char *headers)
{
    char *yaml = xasprintf("upstream:%s\n", upstream_yaml);
    config_errors_t errs = {0};
    config_t *cfg = config_load_string(what, yaml, &errs);
    free(yaml);
    if (!cfg) {
        for (size_t i = 0; i < errs.n; i++)
            fprintf(stderr, "idemgw policy init: %s\n", errs.msgs[i]);
        config_errors_free(&errs);
        return EXIT_USAGE;
    }
    config_errors_free(&errs);
    int rc = init(cfg, upstream_yaml, NULL, NULL, headers, NULL);
    config_free(cfg);
    return rc;
}

/* A JSON string is a YAML double-quoted scalar: a URL or an argument written safely. */
static char *yaml_quoted(const char *s)
{
    json_t *j = json_string(s);
    char *out = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return out ? out : xstrdup("\"\"");
}

static int init_url(const char *url, const char *headers)
{
    char *q = yaml_quoted(url);
    char *yaml = xasprintf(" %s", q);
    free(q);
    int rc = init_upstream("--upstream", yaml, headers);
    free(yaml);
    return rc;
}

/* The child gets PATH and HOME only: a command that fetches its package first (npx -y, uvx)
 * behind a proxy or a private CA would wait for a registry it cannot reach, here and in the
 * gateway. The variables for that which are set here and not in have (a pass_env list, may be
 * NULL), as "A, B" in names (names only: values stay in the environment); false when none. */
static bool reach_names(char *const *have, char *names, size_t size)
{
    static const char *const reach[] = {
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NODE_EXTRA_CA_CERTS",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "NPM_CONFIG_REGISTRY",
        "npm_config_registry",
        "PIP_INDEX_URL",
        "UV_INDEX_URL",
    };
    size_t used = 0;
    names[0] = '\0';
    for (size_t i = 0; i < ARRAY_LEN(reach); i++) {
        bool had = false;
        for (char *const *h = have; h && *h && !had; h++)
            had = strcmp(*h, reach[i]) == 0;
        if (!had && getenv(reach[i]) && used + strlen(reach[i]) + 3 < size)
            used += (size_t)snprintf(names + used, size - used, "%s%s", used ? ", " : "", reach[i]);
    }
    return used > 0;
}

static int init_command(char **argv, int argc, const char *headers)
{
    if (headers[0]) {
        fprintf(stderr, "idemgw policy init: -H is for an HTTP upstream, not a command\n");
        return EXIT_USAGE;
    }
    char *yaml = xstrdup("\n  command: [");
    for (int i = 0; i < argc; i++) {
        char *q = yaml_quoted(argv[i]);
        char *more = xasprintf("%s%s%s", yaml, i ? ", " : "", q);
        free(q);
        free(yaml);
        yaml = more;
    }
    char *full = xasprintf("%s]", yaml);
    free(yaml);
    char names[512];
    if (reach_names(NULL, names, sizeof(names))) {
        char *more = xasprintf("%s\n  # what reaching a package registry needs here: names of this "
                               "environment's variables\n  pass_env: [%s]",
                               full, names);
        free(full);
        full = more;
    }
    int rc = init_upstream("the command after --", full, headers);
    free(full);
    return rc;
}

/* Loads path (NULL: the environment's), reporting its errors; NULL when it does not load. */
static config_t *load(const char *path)
{
    config_errors_t errs = {0};
    config_t *cfg = config_load(path, &errs);
    for (size_t i = 0; !cfg && i < errs.n; i++)
        fprintf(stderr, "%s\n", errs.msgs[i]);
    config_errors_free(&errs);
    return cfg;
}

/* Adds the names of list ("A, B") to conf's pass_env. */
static void add_pass_env(stdio_conf_t *conf, const char *list)
{
    size_t n = 0;
    while (conf->pass_env && conf->pass_env[n])
        n++;
    char *copy = xstrdup(list);
    char *save = NULL;
    for (char *name = strtok_r(copy, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
        conf->pass_env = xrealloc(conf->pass_env, (n + 2) * sizeof(char *));
        conf->pass_env[n++] = xstrdup(name);
        conf->pass_env[n] = NULL;
    }
    free(copy);
}

/* init -c FILE --server NAME: the tools: of that server's entry. */
static int init_server(const char *path, const char *name, const char *headers)
{
    config_t *cfg = load(path), *view;
    if (!cfg)
        return EXIT_USAGE;
    int rc = EXIT_USAGE;
    if (server_arg_pick("idemgw policy init", cfg, name, false, &view) != 0)
        goto out;
    if (!view->server_name) {
        fprintf(stderr, "idemgw policy init: needs --upstream URL, or -c FILE --server NAME for "
                        "a server of its servers:\n");
        goto out;
    }
    /* what init -- CMD writes into a new config: here the entry's upstream exists, so the
     * snippet says what to add, and the fetch passes them as the gateway then will */
    char names[512];
    bool missing = view->stdio.argv && reach_names(view->stdio.pass_env, names, sizeof(names));
    if (missing) {
        fprintf(stderr,
                "idemgw policy init: server %s: its upstream's pass_env lacks %s, set here: "
                "they were passed to read its tools; the snippet says where they go\n",
                view->server_name, names);
        add_pass_env(&view->stdio, names);
    }
    rc = init(view, NULL, path, view->server_name, headers, missing ? names : NULL);
out:
    config_free(cfg);
    return rc;
}

/* --- diff --- */

/* A tool the policy protects though the server says repeating it is harmless: safe, so no
 * drift (exit 0), but it costs a claim per call and a replay where a fresh answer was meant
 * (idempotent and read are both forwarded untouched: no difference worth a line). */
static void stricter(const policy_tool_t *t, const catalog_tool_t *k)
{
    if (t->cls != TOOL_CLASS_NON_IDEMPOTENT || k->destructive == HINT_TRUE)
        return;
    const char *says = k->read_only == HINT_TRUE    ? "is read-only (readOnlyHint: true)"
                       : k->idempotent == HINT_TRUE ? "is idempotent (idempotentHint: true)"
                                                    : NULL;
    if (says)
        printf("stricter: %s is non_idempotent in the policy, but the server says it %s: its "
               "repeats get the first answer replayed, not a fresh one\n",
               t->name, says);
}

static int diff(const char *path, const char *server, const char *headers)
{
    config_t *top = load(path), *cfg; /* cfg: the server compared, a view of top's servers: */
    if (!top)
        return EXIT_USAGE;
    if (server_arg_pick("idemgw policy diff", top, server, false, &cfg) != 0) {
        config_free(top);
        return EXIT_USAGE;
    }
    catalog_t *catalog = catalog_new();
    catalog_set_policy(catalog, &cfg->policy);
    char err[2048]; /* a stdio server's stderr lines too */
    int found = 0;
    if (catalog_fetch_now(cfg, headers, catalog, NULL, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "idemgw policy diff: %s%s%s%s: %s\n", server ? "server " : "",
                server ? server : "", server ? ", " : "", cfg->upstream_url, err);
        found = 1;
        goto out;
    }
    for (size_t i = 0; i < cfg->policy.n_tools; i++) {
        const policy_tool_t *t = &cfg->policy.tools[i];
        const catalog_tool_t *k = catalog_find(catalog, t->name);
        if (!k) {
            printf("not on the server: %s (policy: %s)\n", t->name, tool_class_name(t->cls));
            found++;
            continue;
        }
        /* a read the server says writes, or an idempotent write it says is not idempotent:
         * the policy would forward repeats of it unprotected */
        if (t->cls == TOOL_CLASS_READ &&
            (k->read_only == HINT_FALSE || k->destructive == HINT_TRUE)) {
            printf("warning: %s is read in the policy, but the server says it %s\n", t->name,
                   k->destructive == HINT_TRUE ? "is destructive (destructiveHint: true)"
                                               : "writes (readOnlyHint: false)");
            found++;
        } else if (t->cls == TOOL_CLASS_IDEMPOTENT && k->idempotent == HINT_FALSE &&
                   k->read_only != HINT_TRUE) {
            printf("warning: %s is idempotent in the policy, but the server says it is not "
                   "(idempotentHint: false)\n",
                   t->name);
            found++;
        } else {
            stricter(t, k);
        }
    }
    for (size_t i = 0; i < catalog_size(catalog); i++) {
        const catalog_tool_t *k = catalog_at(catalog, i);
        if (policy_find(&cfg->policy, k->name))
            continue;
        class_source_t src;
        tool_class_t cls = catalog_classify(catalog, k->name, &src);
        printf("not in the policy: %s (gets %s, from %s)\n", k->name, tool_class_name(cls),
               class_source_name(src));
        found++;
    }
out:
    catalog_free(catalog);
    config_free(top);
    if (fflush(stdout) != 0)
        return EXIT_FOUND;
    return found ? EXIT_FOUND : 0;
}

int policy_cmd_main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "init") != 0 && strcmp(argv[1], "diff") != 0)) {
        bool help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        usage(help ? stdout : stderr);
        return help ? 0 : EXIT_USAGE;
    }
    bool is_init = strcmp(argv[1], "init") == 0;
    catalog_cli_t o;
    int r =
        catalog_cli_parse(argc - 1, argv + 1, is_init ? "idemgw policy init" : "idemgw policy diff",
                          is_init, usage, &o);
    if (r != 0)
        return r > 0 ? 0 : EXIT_USAGE;
    bool alone = o.upstream || o.command; /* an upstream given on the command line */
    if (is_init && ((o.upstream && o.command) || (alone ? o.config || o.server : !o.config))) {
        fprintf(stderr, "idemgw policy init: needs --upstream URL or -- CMD ARGS (and no -c or "
                        "--server), or -c FILE --server NAME for a server of its servers:\n");
        usage(stderr);
        return EXIT_USAGE;
    }
    log_threshold = LOG_OFF; /* the output is the answer */
    if (is_init)
        return o.upstream  ? init_url(o.upstream, o.headers)
               : o.command ? init_command(o.command, o.n_command, o.headers)
                           : init_server(o.config, o.server, o.headers);
    return diff(o.config, o.server, o.headers);
}
