/* `idemgw stdio`'s command line and its store file (see include/stdio_args.h). */
#include "stdio_args.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Longest label kept in a store file's name. */
#define LABEL_MAX 40
/* Hex digits of the command's hash in a store file's name (64 bits). */
#define HASH_HEX 16

const char *stdio_args_result_str(stdio_args_result_t r)
{
    switch (r) {
    case STDIO_ARGS_RUN:
        return "run";
    case STDIO_ARGS_HELP:
        return "help";
    case STDIO_ARGS_BAD:
        return "bad";
    }
    return "?";
}

/* Headers every request of the wrapper carries already, or that would change its framing. */
static const char *const own_headers[] = {
    "host",       "content-type",      "content-length", "accept",
    "connection", "transfer-encoding", "mcp-session-id", "mcp-protocol-version",
};

static bool token_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* NULL when h is a header the wrapper may send, else what is wrong with it. */
static const char *header_problem(const char *h)
{
    size_t n = 0;
    while (token_char(h[n]))
        n++;
    if (n == 0 || h[n] != ':')
        return "is not 'Name: value'";
    if (strpbrk(h, "\r\n"))
        return "holds a line break";
    for (size_t i = 0; i < ARRAY_LEN(own_headers); i++)
        if (strlen(own_headers[i]) == n && strncasecmp(h, own_headers[i], n) == 0)
            return "is one the wrapper sets itself";
    return NULL;
}

stdio_args_result_t stdio_args_parse(int argc, char **argv, stdio_args_t *out, char *msg,
                                     size_t msglen)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"header", required_argument, NULL, 'H'},
        {"log-file", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *out = (stdio_args_t){0};
    msg[0] = '\0';
    out->headers = xcalloc((size_t)argc + 1, sizeof(char *));
    optind = 0; /* a fresh scan: tests parse more than once in a process */
    opterr = 0; /* the messages below name the command */
    int c;
    /* '+': the first word that is not an option begins the command; its own options stay its */
    while ((c = getopt_long(argc, argv, "+:c:H:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            out->config = optarg;
            break;
        case 'H': {
            const char *why = header_problem(optarg);
            if (why) {
                snprintf(msg, msglen, "header '%s' %s", optarg, why);
                return STDIO_ARGS_BAD;
            }
            out->headers[out->n_headers++] = optarg;
            break;
        }
        case 'L':
            out->log_file = optarg;
            break;
        case 'h':
            return STDIO_ARGS_HELP;
        case ':':
            snprintf(msg, msglen, "%s needs a value", argv[optind - 1]);
            return STDIO_ARGS_BAD;
        default:
            if (optopt && optopt != '?')
                snprintf(msg, msglen, "unknown option '-%c'", optopt);
            else
                snprintf(msg, msglen, "unknown option '%s'", argv[optind - 1]);
            return STDIO_ARGS_BAD;
        }
    }
    bool dashes = optind > 1 && strcmp(argv[optind - 1], "--") == 0;
    if (optind < argc)
        out->command = argv + optind;
    else if (dashes) {
        snprintf(msg, msglen, "no command after '--'");
        return STDIO_ARGS_BAD;
    }
    if (!out->command && !out->config) {
        snprintf(msg, msglen,
                 "no server to wrap: give its command after '--', or -c FILE with upstream");
        return STDIO_ARGS_BAD;
    }
    return STDIO_ARGS_RUN;
}

void stdio_args_free(stdio_args_t *a)
{
    free(a->headers);
    *a = (stdio_args_t){0};
}

/* The word that names the server best: the last one that is not an option. */
static const char *label_word(char *const *words)
{
    const char *best = words[0];
    for (size_t i = 1; words[i]; i++)
        if (words[i][0] != '-' && words[i][0] != '\0')
            best = words[i];
    return best;
}

/* word's last path segment, cut to safe characters, a script's extension dropped. */
static void make_label(const char *word, char *out, size_t outlen)
{
    static const char *const script_ext[] = {".js", ".mjs", ".cjs", ".ts", ".py", ".sh"};
    const char *base = word;
    for (const char *p = word; *p; p++)
        if (p[1] && *p == '/')
            base = p + 1;
    size_t n = 0;
    for (const char *p = base; *p && *p != '/' && n + 1 < outlen; p++) {
        char ch = *p;
        bool safe = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        out[n++] = safe ? ch : '_';
    }
    out[n] = '\0';
    for (size_t i = 0; i < ARRAY_LEN(script_ext); i++) {
        size_t e = strlen(script_ext[i]);
        if (n > e && strcmp(out + n - e, script_ext[i]) == 0) {
            out[n - e] = '\0';
            break;
        }
    }
    if (out[0] == '\0' || out[0] == '.')
        snprintf(out, outlen, "server");
}

char *stdio_args_store_file(const char *default_file, char *const *words)
{
    if (!default_file || !words || !words[0])
        return NULL;
    /* every word with its terminating NUL, so ["a b"] and ["a", "b"] differ */
    size_t len = 0;
    for (size_t i = 0; words[i]; i++)
        len += strlen(words[i]) + 1;
    char *joined = xmalloc(len ? len : 1);
    size_t at = 0;
    for (size_t i = 0; words[i]; i++) {
        size_t n = strlen(words[i]) + 1;
        memcpy(joined + at, words[i], n);
        at += n;
    }
    char hex[65];
    util_sha256_hex(joined, len, hex);
    free(joined);
    char label[LABEL_MAX + 1];
    make_label(label_word(words), label, sizeof(label));
    const char *slash = strrchr(default_file, '/');
    int dir_len = slash ? (int)(slash - default_file) : 0;
    return xasprintf("%.*s%sstdio-%s-%.*s.db", dir_len, default_file, slash ? "/" : "", label,
                     HASH_HEX, hex);
}
