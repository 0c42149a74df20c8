/* lone's C API, end to end: version, tokenize/detokenize, a sequence generated greedily,
 * a streamed chat, and an error path.
 *
 *   cargo build --release -p lone-capi
 *   cc examples/c/chat.c -I crates/lone-capi/include -L target/release -llone \
 *      -Wl,-rpath,$PWD/target/release -o chat
 *   ./chat [MODEL.gguf]
 *
 * Sections of its output are marked with "== name ==" lines (crates/lone-capi/tests/
 * c_example.rs reads them). Exits 1 on an unexpected failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lone.h"

#define CHECK(call)                                                                  \
    do {                                                                             \
        lone_status st_ = (call);                                                    \
        if (st_ != LONE_OK) {                                                        \
            fprintf(stderr, "%s failed (%d): %s\n", #call, (int)st_, lone_last_error()); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* Streams text to stdout. */
static bool print_piece(const char *piece, size_t len, void *user) {
    size_t *total = user;
    *total += len;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : NULL; /* NULL: the default model */
    printf("== version ==\n%s\n", lone_version());

    lone_model *model = NULL;
    CHECK(lone_model_open(path, "{\"threads\": 2, \"parallel\": 1}", &model));

    char *info = NULL;
    CHECK(lone_model_info(model, &info));
    printf("== info ==\n%s\n", info);
    lone_string_free(info);

    /* Tokenize: ask for the count, then fill a buffer of that size. */
    const char *text = "Hello from C: the quick brown fox.";
    size_t n = 0;
    lone_status st = lone_tokenize(model, text, false, NULL, 0, &n);
    if (st != LONE_ERR_BUFFER || n == 0) {
        fprintf(stderr, "expected LONE_ERR_BUFFER with a count, got %d: %s\n", (int)st,
                lone_last_error());
        return 1;
    }
    uint32_t *ids = malloc(n * sizeof *ids);
    CHECK(lone_tokenize(model, text, false, ids, n, &n));
    char *back = NULL;
    CHECK(lone_detokenize(model, ids, n, &back));
    printf("== tokens ==\n%zu\n== roundtrip ==\n%s\n", n, back);
    lone_string_free(back);
    free(ids);

    /* A sequence: the prompt's ids (with BOS), then 16 greedy tokens streamed. */
    const char *prompt = "The capital of France is";
    uint32_t pids[64];
    size_t pn = 0;
    CHECK(lone_tokenize(model, prompt, true, pids, 64, &pn));
    lone_seq *seq = NULL;
    CHECK(lone_seq_new(model, &seq));
    CHECK(lone_seq_feed(seq, pids, pn));
    printf("== prompt ids ==\n");
    for (size_t i = 0; i < pn; i++) printf(i ? ",%u" : "%u", pids[i]);
    printf("\n== generate ==\n");
    size_t streamed = 0;
    char *gen = NULL;
    CHECK(lone_seq_generate(seq, "{\"max_tokens\": 16, \"temperature\": 0}", print_piece,
                            &streamed, &gen));
    printf("\n== end generate ==\n");
    if (streamed != strlen(gen)) {
        fprintf(stderr, "streamed %zu bytes but the text has %zu\n", streamed, strlen(gen));
        return 1;
    }
    const uint32_t *all = NULL;
    size_t total = 0;
    CHECK(lone_seq_tokens(seq, &all, &total));
    printf("== sequence length ==\n%zu\n", total);
    lone_string_free(gen);
    lone_seq_free(seq);

    /* A chat, its content streamed, then the whole response. */
    printf("== chat ==\n");
    char *resp = NULL;
    streamed = 0;
    CHECK(lone_chat(model,
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 2 + 2?\"}],"
                    "\"max_tokens\":16,\"temperature\":0}",
                    print_piece, &streamed, &resp));
    printf("\n== chat response ==\n%s\n", resp);
    lone_string_free(resp);

    /* An error: a file that is not there. */
    lone_model *missing = NULL;
    st = lone_model_open("/nonexistent/model.gguf", NULL, &missing);
    if (st != LONE_ERR_LOAD || missing != NULL) {
        fprintf(stderr, "opening a missing file gave %d, not LONE_ERR_LOAD\n", (int)st);
        return 1;
    }
    printf("== error ==\n%s\n", lone_last_error());

    lone_model_free(model);
    printf("== done ==\n");
    return 0;
}
