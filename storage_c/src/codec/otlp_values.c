/*
 * otlp_values.c - the parts of an OTLP event that are JSON values, in
 * protobuf: an event's members by name, the JSON pointers its value_types
 * name, AnyValue (bodies, attribute values, nested arrays and maps),
 * attribute lists, and the heads every record repeats (resource, scope, a
 * data point's metric).  otlp_encode.c says how the encoder's parts fit.
 *
 * Values keep their JSON types: an integer is int_value, a number with a
 * fraction or an exponent double_value; value_types marks bytes (base64) and
 * non-finite doubles ("NaN", "Infinity", "-Infinity").  Attributes are
 * written as they come, repeated keys included (OTLP forbids them; the
 * layout kept what the producer sent).  JSON pointers are rendered only
 * while the event has value_types at all: most events have none.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "otlp_encoder.h"
#include "port/port.h"

/* ---- objects: their keys, indexed ------------------------------------------------ */

/* Reads the object at `v` and puts the text of each member named in
 * names[0, n) into out (absent members: p NULL; a repeated key: its last). */
int enc_index_object(enc *e, jspan v, const char *const *names, int n, jspan *out,
                        const char *what)
{
    for (int i = 0; i < n; i++)
        out[i].p = NULL, out[i].len = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_OBJECT)
        return reject(e, "%s is not an object", what);
    jspan key;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        int i = 0;
        while (i < n && !(names[i][0] == (key.len ? key.p[0] : 0) &&
                          strncmp(names[i], (const char *)key.p, key.len) == 0 && !names[i][key.len]))
            i++;
        if (!jr_skip_fast(&e->r, i < n ? &out[i] : NULL))
            break;
    }
    if (e->r.why)
        return reject(e, "%s", e->r.why);
    return 1;
}

/* ---- JSON pointers and value_types ---------------------------------------------- */

static size_t path_push(enc *e, const uint8_t *name, size_t len)
{
    size_t mark = e->path.len;
    if (!e->track)
        return mark;
    oj_byte(&e->path, '/');
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '~')
            oj_lit(&e->path, "~0");
        else if (name[i] == '/')
            oj_lit(&e->path, "~1");
        else
            oj_byte(&e->path, name[i]);
    }
    return mark;
}

size_t enc_path_push_lit(enc *e, const char *name)
{
    return path_push(e, (const uint8_t *)name, strlen(name));
}

size_t enc_path_push_index(enc *e, uint32_t i)
{
    size_t mark = e->path.len;
    if (!e->track)
        return mark;
    char text[16];
    int n = snprintf(text, sizeof text, "/%u", i);
    oj_put(&e->path, text, (size_t)n);
    return mark;
}

void enc_path_pop(enc *e, size_t mark)
{
    e->path.len = mark;
}

/* The value_types kind of the value at the current pointer (0: none). */
static int type_here(const enc *e)
{
    if (!e->track)
        return 0;
    for (uint32_t i = e->ntypes; i-- > 0;) { /* the last of repeated pointers */
        const vtype *t = &e->types[i];
        if (t->pointer.len == e->path.len && memcmp(t->pointer.p, e->path.p, e->path.len) == 0)
            return t->kind;
    }
    return 0;
}

int enc_read_types(enc *e, jspan v)
{
    e->ntypes = 0;
    e->track = 0;
    if (!v.p)
        return 1;
    read_at(e, v);
    if (jr_peek(&e->r) != J_OBJECT)
        return reject(e, "%s is not an object", "value_types");
    jspan key, kind;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        if (!jr_string(&e->r, &kind))
            return json_problem(e, "value_types");
        int k = JSPAN_IS(kind, "bytes") ? VT_BYTES : JSPAN_IS(kind, "double") ? VT_DOUBLE : 0;
        if (!k)
            return reject(e, "value_types holds an unknown type%s", "");
        if (e->ntypes == e->types_cap) {
            uint32_t cap = e->types_cap ? e->types_cap * 2 : 16;
            if (cap > MAX_TYPES)
                return reject(e, "value_types has too many entries%s", "");
            vtype *grown = sys_realloc(e->types, cap * sizeof *grown);
            if (!grown) {
                e->out.failed = 1;
                return reject(e, "out of memory%s", "");
            }
            e->types = grown;
            e->types_cap = cap;
        }
        e->types[e->ntypes++] = (vtype){key, k};
    }
    if (e->r.why)
        return json_problem(e, "value_types");
    e->track = e->ntypes > 0;
    return 1;
}

/* ---- values --------------------------------------------------------------------- */

static int base64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Standard base64, padded (what otlp_json.c writes), into bytes at `field`. */
static int put_base64(enc *e, ojbuf *b, uint32_t field, jspan s)
{
    if (s.len % 4)
        return reject(e, "%s is not base64", "a bytes value");
    size_t pad = s.len && s.p[s.len - 1] == '=' ? (s.len > 1 && s.p[s.len - 2] == '=' ? 2 : 1) : 0;
    size_t n = s.len / 4 * 3 - pad;
    pb_tag(b, field, WT_LEN);
    pb_varint(b, n);
    uint8_t *w = ojbuf_room(b, n + 3);
    if (!w)
        return 1; /* the buffer's failure is reported for the whole call */
    size_t o = 0;
    for (size_t i = 0; i < s.len; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            int c = s.p[i + k];
            v[k] = c == '=' && i + 4 == s.len && k >= 4 - (int)pad ? 0 : base64_value(c);
            if (v[k] < 0)
                return reject(e, "%s is not base64", "a bytes value");
        }
        uint32_t q = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        w[o] = (uint8_t)(q >> 16);
        w[o + 1] = (uint8_t)(q >> 8);
        w[o + 2] = (uint8_t)q;
        o += 3;
    }
    b->len += n;
    return 1;
}

static int attributes(enc *e, ojbuf *b, uint32_t field, uint32_t depth);

/* The AnyValue at the reader, its fields written into b.  In the layout, an
 * integer is int_value and a number with a fraction or an exponent
 * double_value; value_types marks bytes (base64) and non-finite doubles.
 * For plain events an integer beyond int64 keeps its digits as a string. */
int enc_any_value(enc *e, ojbuf *b, uint32_t depth)
{
    if (depth > COMET_OTLP_MAX_DEPTH)
        return reject(e, "a value nests deeper than %s levels", "32");
    int kind = type_here(e);
    enum jtype t = jr_peek(&e->r);
    jspan s;
    jnum n;
    int flag;
    if (kind == VT_BYTES) {
        if (t != J_STRING || !jr_string(&e->r, &s))
            return json_problem(e, "a bytes value");
        return put_base64(e, b, 7, s);
    }
    if (kind == VT_DOUBLE) {
        double x;
        if (!read_double(e, "a double value", &x))
            return 0;
        pb_double(b, 4, x, 1);
        return 1;
    }
    switch (t) {
    case J_NULL:
        return jr_null(&e->r) ? 1 : json_problem(e, "a value");
    case J_TRUE:
    case J_FALSE:
        jr_bool(&e->r, &flag);
        pb_tag(b, 2, WT_VARINT);
        pb_varint(b, (uint64_t)flag);
        return 1;
    case J_STRING:
        if (!jr_string(&e->r, &s))
            return json_problem(e, "a string value");
        pb_bytes(b, 1, s.p, s.len, 1);
        return 1;
    case J_NUMBER: {
        const uint8_t *text = e->r.p;
        if (!jr_number(&e->r, &n))
            return json_problem(e, "a number");
        if (!n.integer) {
            pb_double(b, 4, jnum_value(&n), 1);
            return 1;
        }
        if (n.overflow || n.magnitude > (n.negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) {
            if (!e->plain)
                return reject(e, "%s is out of range", "an integer value");
            pb_bytes(b, 1, text, (size_t)(e->r.p - text), 1);
            return 1;
        }
        pb_tag(b, 3, WT_VARINT);
        pb_varint(b, n.negative ? (uint64_t)0 - n.magnitude : n.magnitude);
        return 1;
    }
    case J_ARRAY: {
        pbmark array = pb_open(b, 5);
        jr_array(&e->r);
        uint32_t i = 0;
        while (jr_next_item(&e->r)) {
            size_t mark = enc_path_push_index(e, i++);
            pbmark item = pb_open(b, 1);
            if (!enc_any_value(e, b, depth + 1))
                return 0;
            pb_close(b, item);
            enc_path_pop(e, mark);
        }
        if (e->r.why)
            return json_problem(e, "an array");
        pb_close(b, array);
        return 1;
    }
    case J_OBJECT: {
        pbmark map = pb_open(b, 6);
        if (!attributes(e, b, 1, depth + 1))
            return 0;
        pb_close(b, map);
        return 1;
    }
    default:
        return json_problem(e, "a value");
    }
}

/* The object at the reader as KeyValues at `field`, in order, repeated keys
 * included. */
static int attributes(enc *e, ojbuf *b, uint32_t field, uint32_t depth)
{
    if (jr_peek(&e->r) != J_OBJECT)
        return json_problem(e, "attributes");
    jspan key;
    jr_object(&e->r);
    while (jr_next_key(&e->r, &key)) {
        size_t mark = path_push(e, key.p, key.len);
        pbmark kv = pb_open(b, field);
        pb_bytes(b, 1, key.p, key.len, 0);
        pbmark value = pb_open(b, 2);
        if (!enc_any_value(e, b, depth))
            return 0;
        pb_close_or_drop(b, value);
        pb_close(b, kv);
        enc_path_pop(e, mark);
    }
    if (e->r.why)
        return json_problem(e, "attributes");
    return 1;
}

/* The attributes object whose text is v, at `field`, under pointer `name`. */
int enc_put_attributes(enc *e, ojbuf *b, uint32_t field, jspan v, const char *name)
{
    if (!v.p)
        return 1;
    size_t mark = enc_path_push_lit(e, name);
    read_at(e, v);
    int ok = attributes(e, b, field, 0);
    enc_path_pop(e, mark);
    return ok;
}

/* ---- heads: resource, scope, metric --------------------------------------------- */

/* A head buffer: [length of the message][the message][schema_url]. */
void enc_put_head(ojbuf *head, const ojbuf *message, jspan schema)
{
    head->len = 0;
    pb_varint(head, message->len);
    oj_put(head, message->p, message->len);
    oj_put(head, schema.p, schema.len);
}

int enc_resource_head(enc *e, jspan v, ojbuf *scratch)
{
    static const char *const names[] = {"attributes", "dropped_attributes_count", "entity_refs",
                                        "schema_url"};
    static const char *const ref_names[] = {"schema_url", "type", "id_keys", "description_keys"};
    jspan f[4], rf[4], schema;
    scratch->len = 0;
    size_t mark = enc_path_push_lit(e, "resource");
    if (!enc_index_object(e, v, names, 4, f, "resource") ||
        !enc_put_attributes(e, scratch, 1, f[0], "attributes") ||
        !put_uint(e, scratch, 2, f[1], "dropped_attributes_count", UINT32_MAX))
        return 0;
    enc_path_pop(e, mark);
    if (f[2].p) {
        read_at(e, f[2]);
        if (jr_peek(&e->r) != J_ARRAY)
            return reject(e, "%s is not an array", "entity_refs");
        jspan item;
        jr_array(&e->r);
        while (jr_next_item(&e->r)) {
            if (!jr_skip(&e->r, &item))
                break;
            const uint8_t *resume = e->r.p, *end = e->r.end;
            uint32_t depth = e->r.depth;
            pbmark ref = pb_open(scratch, 3);
            if (!enc_index_object(e, item, ref_names, 4, rf, "an entity ref") ||
                !put_string(e, scratch, 1, rf[0], "schema_url") ||
                !put_string(e, scratch, 2, rf[1], "type"))
                return 0;
            for (int k = 2; k < 4; k++) {
                if (!rf[k].p)
                    continue;
                read_at(e, rf[k]);
                jspan s;
                if (jr_peek(&e->r) != J_ARRAY)
                    return reject(e, "%s is not an array", ref_names[k]);
                jr_array(&e->r);
                while (jr_next_item(&e->r)) {
                    if (jr_peek(&e->r) != J_STRING)
                        return reject(e, "%s has the wrong type", ref_names[k]);
                    if (!jr_string(&e->r, &s))
                        return json_problem(e, ref_names[k]);
                    pb_bytes(scratch, (uint32_t)k + 1, s.p, s.len, 1);
                }
                if (e->r.why)
                    return json_problem(e, ref_names[k]);
            }
            pb_close(scratch, ref);
            e->r.p = resume, e->r.end = end, e->r.depth = depth;
        }
        if (e->r.why)
            return json_problem(e, "entity_refs");
    }
    if (!get_string(e, f[3], "schema_url", &schema))
        return 0;
    enc_put_head(&e->head[0], scratch, schema);
    return 1;
}

int enc_scope_head(enc *e, jspan v, ojbuf *scratch)
{
    static const char *const names[] = {"name", "version", "attributes", "dropped_attributes_count",
                                        "schema_url"};
    jspan f[5], schema;
    scratch->len = 0;
    size_t mark = enc_path_push_lit(e, "scope");
    if (!enc_index_object(e, v, names, 5, f, "scope") ||
        !put_string(e, scratch, 1, f[0], "scope name") ||
        !put_string(e, scratch, 2, f[1], "scope version") ||
        !enc_put_attributes(e, scratch, 3, f[2], "attributes") ||
        !put_uint(e, scratch, 4, f[3], "dropped_attributes_count", UINT32_MAX) ||
        !get_string(e, f[4], "schema_url", &schema))
        return 0;
    enc_path_pop(e, mark);
    enc_put_head(&e->head[1], scratch, schema);
    return 1;
}

/* Metric types, their Metric field numbers, and what their data carries. */
static const char *const METRIC_TYPES[] = {"gauge", "sum", "histogram", "exponential_histogram",
                                           "summary"};
const uint32_t ENC_METRIC_FIELDS[] = {5, 7, 9, 10, 11};

/* The metric head: [type][temporality varint][monotonic][length][name,
 * description, unit][metadata KeyValues at field 12]. */
int enc_metric_head(enc *e, jspan v, ojbuf *scratch, int *type)
{
    static const char *const names[] = {"name", "description", "unit", "type",
                                        "aggregation_temporality", "is_monotonic", "metadata"};
    jspan f[7], t;
    int64_t temporality;
    int monotonic;
    scratch->len = 0;
    if (!v.p)
        return reject(e, "%s is missing", "metric");
    if (!enc_index_object(e, v, names, 7, f, "metric") ||
        !put_string(e, scratch, 1, f[0], "metric name") ||
        !put_string(e, scratch, 2, f[1], "metric description") ||
        !put_string(e, scratch, 3, f[2], "metric unit") || !get_string(e, f[3], "metric type", &t) ||
        !get_i64(e, f[4], "aggregation_temporality", INT32_MIN, INT32_MAX, &temporality) ||
        !get_bool(e, f[5], "is_monotonic", &monotonic))
        return 0;
    for (*type = 0; *type < 5; (*type)++)
        if (strlen(METRIC_TYPES[*type]) == t.len && memcmp(METRIC_TYPES[*type], t.p, t.len) == 0)
            break;
    if (*type == 5)
        return reject(e, "%s is not a metric type", "metric type");
    ojbuf *head = &e->head[2];
    head->len = 0;
    oj_byte(head, (uint8_t)*type);
    pb_varint(head, (uint64_t)temporality);
    oj_byte(head, (uint8_t)monotonic);
    pb_varint(head, scratch->len);
    oj_put(head, scratch->p, scratch->len);
    size_t mark = enc_path_push_lit(e, "metric");
    int ok = enc_put_attributes(e, head, 12, f[6], "metadata");
    enc_path_pop(e, mark);
    return ok;
}
