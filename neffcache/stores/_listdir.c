/* neffcache.stores._listdir: the listing loop of a scan, in C.
 *
 * The pure-Python listing (neffcache/stores/local_listing.py) spends ~3 us per file on
 * os.scandir + DirEntry.stat (the syscall plus a stat_result) before any scan work starts: a
 * floor of ~1.5x `find -printf`. This module does the same syscalls and builds only what the
 * scan keeps: names, and FileInfo tuples (path, size, mtime) made directly through the
 * FileInfo type's tp_alloc (a NamedTuple is a tuple subclass).
 *
 * Containment is the Python listing's, syscall for syscall:
 *  - a directory is opened with openat(parent, name, O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC),
 *    so a symlinked directory fails (ELOOP/ENOTDIR) instead of being followed;
 *  - entries are classified by d_type, and by fstatat(AT_SYMLINK_NOFOLLOW) where the
 *    filesystem gives DT_UNKNOWN; regular files are stat'ed with AT_SYMLINK_NOFOLLOW;
 *  - a symlink is never resolved here: its name is handed back (``links``) for
 *    SafeRoot.resolve_listed_link, which applies the root's rules and words the problems.
 * Errors are the ones os.scandir and DirEntry.stat raise (OSError with errno), at the same
 * points: a name that vanished (ENOENT, ENOTDIR) is skipped, anything else fails the listing
 * of that directory, and the caller reports it as the Python walk does.
 *
 * The syscalls of one directory run with the GIL released (a shared mount's stat is a round
 * trip to a metadata server: listing threads then overlap); the Python objects are built after.
 * So what runs without the GIL keeps no state in a static: two threads may run it at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIND_DIR 1
#define KIND_FILE 2
#define KIND_LINK 3
#define KIND_SPECIAL 6  /* a FIFO, a socket, a device: nothing a cache holds, reported (``size``: its S_IFMT) */
/* The Walker's marks on a listing's subdirectories (its section says more). */
#define KIND_PENDING 4  /* a subdirectory of the top frame's listing, not yet settled */
#define KIND_HELD 5  /* a subdirectory named in ``held``: not walked unless released */

typedef struct {
    size_t name;  /* offset of the name in the arena */
    size_t len;
    int kind;
    long long size;
    double mtime;
} Item;

typedef struct {
    Item *items;
    size_t count, cap;
    char *arena;
    size_t used, room;
} Listing;

static void listing_free(Listing *l) {
    free(l->items);
    free(l->arena);
    memset(l, 0, sizeof(*l));
}

/* ``buf`` (``*cap`` elements of ``elem`` bytes) with room for ``needed`` elements: as it is,
 * or grown by doubling from ``first``; NULL when out of memory (``buf`` and ``*cap`` kept).
 * The one growth rule of the listing's and the counts' items and name arenas. */
static void *grow(void *buf, size_t *cap, size_t needed, size_t elem, size_t first) {
    if (needed <= *cap) return buf;
    size_t c = *cap ? *cap * 2 : first;
    while (c < needed) c *= 2;
    void *grown = realloc(buf, c * elem);
    if (grown != NULL) *cap = c;
    return grown;
}

static int listing_add(Listing *l, const char *name, size_t len, int kind, const struct stat *st) {
    Item *items = grow(l->items, &l->cap, l->count + 1, sizeof(Item), 64);
    if (items == NULL) return -1;
    l->items = items;
    char *arena = grow(l->arena, &l->room, l->used + len + 1, 1, 4096);
    if (arena == NULL) return -1;
    l->arena = arena;
    Item *it = &l->items[l->count++];
    it->name = l->used;
    it->len = len;
    it->kind = kind;
    it->size = st ? (long long)st->st_size : 0;
    /* CPython's st_mtime (posixmodule.c fill_time): seconds + nanoseconds * 1e-9. */
    it->mtime = st ? (double)st->st_mtim.tv_sec + (unsigned long)st->st_mtim.tv_nsec * 1e-9 : 0.0;
    memcpy(l->arena + l->used, name, len);
    l->arena[l->used + len] = '\0';
    l->used += len + 1;
    return 0;
}

/* List the directory open as ``fd`` (not consumed) into ``l``, without the GIL. Returns 0, or
 * an errno value (ENOMEM for an allocation failure). */
static int list_dir_nogil(int fd, Listing *l) {
    int dfd = dup(fd);  /* os.scandir(fd) too: closedir closes the copy, the caller's fd stays */
    if (dfd < 0) return errno;
    DIR *dir = fdopendir(dfd);
    if (dir == NULL) {
        int err = errno;
        close(dfd);
        return err;
    }
    int result = 0;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(dir);
        if (de == NULL) {
            result = errno;
            break;
        }
        const char *name = de->d_name;
        if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'))) continue;
        struct stat st;
        mode_t mode = 0;
        int kind = 0;
        switch (de->d_type) {
        case DT_DIR: kind = KIND_DIR; break;
        case DT_LNK: kind = KIND_LINK; break;
        /* Sockets, FIFOs, devices: nothing a cache holds, and a reader that opens one may wait
         * for ever; reported (the Python loop's words, _list_fd_python), never opened. */
        case DT_FIFO: kind = KIND_SPECIAL; mode = S_IFIFO; break;
        case DT_SOCK: kind = KIND_SPECIAL; mode = S_IFSOCK; break;
        case DT_CHR: kind = KIND_SPECIAL; mode = S_IFCHR; break;
        case DT_BLK: kind = KIND_SPECIAL; mode = S_IFBLK; break;
        case DT_REG:
        case DT_UNKNOWN:
            if (fstatat(dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
                if (errno == ENOENT || errno == ENOTDIR) continue;  /* removed while we listed */
                result = errno;
                goto done;
            }
            if (S_ISREG(st.st_mode)) kind = KIND_FILE;
            else if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
                kind = KIND_SPECIAL;
                mode = st.st_mode;
            }
            else if (de->d_type == DT_REG) continue;  /* no longer a regular file */
            else if (S_ISDIR(st.st_mode)) kind = KIND_DIR;
            else if (S_ISLNK(st.st_mode)) kind = KIND_LINK;
            break;
        default: break;  /* DT_WHT and the like: not a file */
        }
        if (kind == 0) continue;
        if (kind == KIND_SPECIAL) {  /* no size, no mtime: what it is, for its problem */
            memset(&st, 0, sizeof(st));
            st.st_size = (off_t)(mode & S_IFMT);
        }
        if (listing_add(l, name, strlen(name), kind, kind == KIND_FILE || kind == KIND_SPECIAL ? &st : NULL) != 0) {
            result = ENOMEM;
            break;
        }
    }
done:
    rewinddir(dir);  /* the descriptor is shared with the caller's: leave it at the start */
    closedir(dir);
    return result;
}

static PyObject *raise_errno(int err) {
    if (err == ENOMEM) return PyErr_NoMemory();
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *make_info(PyTypeObject *info_type, PyObject *path, long long size, double mtime) {
    PyObject *info = info_type->tp_alloc(info_type, 3);
    if (info == NULL) return NULL;
    PyObject *psize = PyLong_FromLongLong(size);
    PyObject *pmtime = PyFloat_FromDouble(mtime);
    if (psize == NULL || pmtime == NULL) {
        Py_XDECREF(psize);
        Py_XDECREF(pmtime);
        Py_DECREF(info);
        return NULL;
    }
    Py_INCREF(path);
    PyTuple_SET_ITEM(info, 0, path);
    PyTuple_SET_ITEM(info, 1, psize);
    PyTuple_SET_ITEM(info, 2, pmtime);
    /* A str, an int and a float cannot be part of a cycle: out of the collector's sight, as
     * CPython's own collector leaves such tuples after its first pass over them. A scan
     * holds four per entry; every full collection would walk them all. */
    PyObject_GC_UnTrack(info);
    return info;
}

/* What a special file is, for its problem: regular.kind's words (neffcache/regular.py). */
static const char *special_kind(long long mode) {
    switch ((mode_t)mode & S_IFMT) {
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    default: return "a special file";
    }
}

/* (name, reason) of a special file's problem: local_listing's words for it (_list_fd_python). */
static PyObject *special_problem(PyObject *name, long long mode) {
    PyObject *reason = PyUnicode_FromFormat("%s, not a regular file (not listed)", special_kind(mode));
    return reason == NULL ? NULL : Py_BuildValue("(ON)", name, reason);
}

/* (subdirs, names, files, links, problems) of a Listing; ``prefix`` is the directory's path
 * plus "/" (bytes, empty at the root). Subdirectory names are returned as bytes when
 * ``raw_dirs``. ``problems``: a tuple of (name, reason), one per special file. */
static PyObject *build(Listing *l, const char *prefix, size_t plen, PyTypeObject *info_type, int raw_dirs) {
    PyObject *subdirs = PyList_New(0), *names = PyList_New(0), *files = PyList_New(0), *links = PyList_New(0);
    PyObject *odd = NULL, *problems = NULL;  /* odd: made for the first special file (most have none) */
    char *buf = NULL;
    size_t bufcap = 0;
    if (subdirs == NULL || names == NULL || files == NULL || links == NULL) goto fail;
    for (size_t i = 0; i < l->count; i++) {
        Item *it = &l->items[i];
        const char *name = l->arena + it->name;
        PyObject *obj;
        /* Counted by the walk (kind 0), or a subdirectory the Walker settles later. */
        if (it->kind == 0 || it->kind == KIND_PENDING || it->kind == KIND_HELD) continue;
        if (it->kind == KIND_DIR && raw_dirs) {
            obj = PyBytes_FromStringAndSize(name, (Py_ssize_t)it->len);
        } else {
            obj = PyUnicode_DecodeFSDefaultAndSize(name, (Py_ssize_t)it->len);
        }
        if (obj == NULL) goto fail;
        if (it->kind == KIND_SPECIAL) {
            PyObject *problem = special_problem(obj, it->size);
            Py_DECREF(obj);
            if (problem == NULL || (odd == NULL && (odd = PyList_New(0)) == NULL) || PyList_Append(odd, problem) != 0) {
                Py_XDECREF(problem);
                goto fail;
            }
            Py_DECREF(problem);
            continue;
        }
        PyObject *target = it->kind == KIND_DIR ? subdirs : it->kind == KIND_LINK ? links : names;
        if (PyList_Append(target, obj) != 0) {
            Py_DECREF(obj);
            goto fail;
        }
        if (it->kind == KIND_FILE) {
            size_t need = plen + it->len;
            if (need > bufcap) {
                char *nbuf = realloc(buf, need + 256);
                if (nbuf == NULL) {
                    Py_DECREF(obj);
                    PyErr_NoMemory();
                    goto fail;
                }
                buf = nbuf;
                bufcap = need + 256;
            }
            PyObject *path;
            if (plen == 0) {
                path = obj;
                Py_INCREF(path);
            } else {
                memcpy(buf, prefix, plen);
                memcpy(buf + plen, name, it->len);
                path = PyUnicode_DecodeFSDefaultAndSize(buf, (Py_ssize_t)need);
            }
            if (path == NULL) {
                Py_DECREF(obj);
                goto fail;
            }
            PyObject *info = make_info(info_type, path, it->size, it->mtime);
            Py_DECREF(path);
            if (info == NULL || PyList_Append(files, info) != 0) {
                Py_XDECREF(info);
                Py_DECREF(obj);
                goto fail;
            }
            Py_DECREF(info);
        }
        Py_DECREF(obj);
    }
    free(buf);
    problems = odd == NULL ? PyTuple_New(0) : PyList_AsTuple(odd);
    Py_XDECREF(odd);
    odd = NULL;
    if (problems == NULL) goto fail;
    return Py_BuildValue("(NNNNN)", subdirs, names, files, links, problems);
fail:
    free(buf);
    Py_XDECREF(subdirs);
    Py_XDECREF(names);
    Py_XDECREF(files);
    Py_XDECREF(links);
    Py_XDECREF(odd);
    return NULL;
}

static int check_info_type(PyObject *type) {
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "info_type must be a tuple subclass (FileInfo)");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(list_dir_doc,
"list_dir(fd, prefix, info_type) -> (subdirs, names, files, links, problems)\n\n"
"List the open directory ``fd`` (not closed). ``prefix`` is its store path plus '/' ('' at the\n"
"root); ``files[i]`` is ``info_type((prefix + names[i], size, mtime))``. Symlinks are not\n"
"followed: their names are in ``links``. A FIFO, socket or device is a (name, reason) of\n"
"``problems``, never opened. Raises OSError as os.scandir would.");

static PyObject *list_dir(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    PyObject *prefix, *info_type;
    if (!PyArg_ParseTuple(args, "iUO:list_dir", &fd, &prefix, &info_type)) return NULL;
    if (check_info_type(info_type) != 0) return NULL;
    PyObject *raw = PyUnicode_EncodeFSDefault(prefix);
    if (raw == NULL) return NULL;
    Listing l = {0};
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = list_dir_nogil(fd, &l);
    Py_END_ALLOW_THREADS
    PyObject *out = err ? raise_errno(err)
                        : build(&l, PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw),
                                (PyTypeObject *)info_type, 0);
    listing_free(&l);
    Py_DECREF(raw);
    return out;
}

/* ---- The largest counted entries: a count's ``top`` -------------------------------------
 *
 * A counted entry never becomes a Python object, so a scan that wants the N largest entries
 * (``--largest N``) cannot pick them out of listings: each count keeps its own N largest as it
 * counts, in an array sorted best first and never longer than N (MAX_LARGEST at most). Most
 * entries lose against the last one kept on their size alone, before their directory is even
 * spelt out; one that gets in costs an insertion. The order is total (bytes descending, then
 * directory, then key), so which entries fill a tie at the N-th place is decided by their
 * names, not by readdir's order. With N = 0 nothing here runs. tests/stores/test_count_plain_top.py
 * and tests/layouts/test_plain_entry_dirs.py hold a top to the one listing in Python finds. */

#define MAX_LARGEST 10000

typedef struct {
    long long bytes, files;
    char *text;  /* the directory, then the key (owned, not terminated) */
    size_t dlen, klen;
} Big;

typedef struct {
    Big *items;  /* best first */
    size_t count, cap, limit;
    char *path;  /* where an entry's directory is spelt out before it is offered */
    size_t room;
} Largest;

static void largest_free(Largest *t) {
    for (size_t i = 0; i < t->count; i++) free(t->items[i].text);
    free(t->items);
    free(t->path);
    t->items = NULL;
    t->path = NULL;
    t->count = t->cap = t->room = 0;
}

/* memcmp's order, a prefix first: on UTF-8, the order of the code points (Python's str order). */
static int bytes_cmp(const char *a, size_t alen, const char *b, size_t blen) {
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c != 0) return c;
    return alen < blen ? -1 : alen > blen;
}

/* Whether the entry (bytes, dir, key) comes before the kept ``b``. */
static int big_before(long long bytes, const char *dir, size_t dlen, const char *key, size_t klen, const Big *b) {
    if (bytes != b->bytes) return bytes > b->bytes;
    int c = bytes_cmp(dir, dlen, b->text, b->dlen);
    if (c != 0) return c < 0;
    return bytes_cmp(key, klen, b->text + b->dlen, b->klen) < 0;
}

/* Whether an entry of ``bytes`` may get in at all: the test before anything is spelt out. */
static int largest_wants(const Largest *t, long long bytes) {
    return t->limit > 0 && (t->count < t->limit || bytes >= t->items[t->count - 1].bytes);
}

/* Offer the entry ``key`` of the directory ``parent``/``name`` (just ``name`` below the root
 * ""): kept when it is among the ``limit`` first so far. 0, or -1 when out of memory. Needs
 * no GIL. */
static int largest_offer(Largest *t, const char *parent, size_t plen, const char *name, size_t nlen,
                         const char *key, size_t klen, long long bytes, long long files) {
    if (!largest_wants(t, bytes)) return 0;
    size_t dlen = plen ? plen + 1 + nlen : nlen;
    char *path = grow(t->path, &t->room, dlen + 1, 1, 256);
    if (path == NULL) return -1;
    t->path = path;
    if (plen) {
        memcpy(path, parent, plen);
        path[plen] = '/';
    }
    memcpy(path + (plen ? plen + 1 : 0), name, nlen);
    size_t lo = 0, hi = t->count;
    while (lo < hi) {  /* the first kept entry this one comes before */
        size_t mid = lo + (hi - lo) / 2;
        if (big_before(bytes, path, dlen, key, klen, &t->items[mid])) hi = mid;
        else lo = mid + 1;
    }
    if (lo == t->limit) return 0;  /* after all the ones kept */
    char *text = malloc(dlen + klen + 1);
    if (text == NULL) return -1;
    if (t->count == t->limit) {
        free(t->items[--t->count].text);  /* the last one drops out */
    } else {
        Big *items = grow(t->items, &t->cap, t->count + 1, sizeof(Big), 16);
        if (items == NULL) {
            free(text);
            return -1;
        }
        t->items = items;
    }
    memcpy(text, path, dlen);
    memcpy(text + dlen, key, klen);
    memmove(&t->items[lo + 1], &t->items[lo], (t->count - lo) * sizeof(Big));
    t->items[lo] = (Big){bytes, files, text, dlen, klen};
    t->count++;
    return 0;
}

/* The kept entries as [(directory, key, bytes, files)], best first. Decoded as they were
 * encoded: the file system's encoding (``fs``, the Walker's names), else UTF-8 with
 * surrogatepass (count_plain's, from str). */
static PyObject *largest_list(const Largest *t, int fs) {
    PyObject *list = PyList_New((Py_ssize_t)t->count);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < t->count; i++) {
        const Big *b = &t->items[i];
        const char *key = b->text + b->dlen;
        PyObject *dir = fs ? PyUnicode_DecodeFSDefaultAndSize(b->text, (Py_ssize_t)b->dlen)
                           : PyUnicode_DecodeUTF8(b->text, (Py_ssize_t)b->dlen, "surrogatepass");
        PyObject *pkey = fs ? PyUnicode_DecodeFSDefaultAndSize(key, (Py_ssize_t)b->klen)
                            : PyUnicode_DecodeUTF8(key, (Py_ssize_t)b->klen, "surrogatepass");
        PyObject *item = dir && pkey ? Py_BuildValue("(OOLL)", dir, pkey, b->bytes, b->files) : NULL;
        Py_XDECREF(dir);
        Py_XDECREF(pkey);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

/* ``largest`` (an int, 0 to MAX_LARGEST) into ``*out``: 0, or -1 with TypeError or ValueError. */
static int check_largest(PyObject *largest, const char *what, size_t *out) {
    if (!PyLong_Check(largest)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int (how many of the largest counted entries a count "
                     "reports), not %.100s", what, Py_TYPE(largest)->tp_name);
        return -1;
    }
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(largest, &overflow);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (overflow || n < 0 || n > MAX_LARGEST) {
        PyErr_Format(PyExc_ValueError, "%s must be 0 to %d", what, MAX_LARGEST);
        return -1;
    }
    *out = (size_t)n;
    return 0;
}

/* ---- count_plain: a shard level's plain entries counted, not listed ---------------------
 *
 * What neffcache/scan/grouping.py's Grouper.count_plain and the layout's plain_entries
 * decide of one shard directory's listings (one per tree), decided here from the directory
 * itself, for every child of a level at once: a scan of a warm layout-B cache is 65,536 such
 * directories, and the per-directory Python (open, list, build the FileInfos, check, count)
 * weighed as much as the entries themselves (docs/performance.md).
 *
 * A child is counted only when every name in it is plain, in the rule the caller passes
 * (stores/plain.py PlainFiles, made by the layout from ShardDir's own rule): a regular file
 * named <key><suffix>, the key key_min..key_max lowercase hex digits starting with the level's
 * prefix plus the child's name, the suffix (from the first dot on) one of ``suffixes``; every
 * key has a non-empty ``primary`` file in a directory that holds primaries. Anything else
 * (a subdirectory, a symlink, a directory that cannot be opened or read, an odd or temp name,
 * an empty primary, a key without its primary) declines the child: the caller lists it the
 * ordinary way, which words every problem. So this may only say "counted" where the Python
 * listing plus count_plain would have counted the same entries and bytes
 * (tests/stores/test_count_plain.py holds it to that on generated directories).
 *
 * Sockets, FIFOs and devices are skipped, and a file that vanished between readdir and
 * fstatat is skipped, as list_dir_nogil skips them.
 *
 * Asked for its ``largest`` entries, a count also keeps those (a ``top``, see above): an entry
 * is a key, its bytes and files those of all its files in every tree, its directory the
 * child's in the first tree (in ``parents`` order) that holds its primary. */

typedef struct {
    size_t key;  /* offset of the key in the arena while files are added (the arena may move) */
    const char *at;  /* the key itself, set once the arena is complete: the sort needs no global */
    size_t len;
    long long size;
    int primary;
    int tree;  /* the index in ``parents`` of the directory the file is in */
} KeyFile;

typedef struct {
    const char *prefix;  /* the level's prefix, then the child's name: every key starts with both */
    size_t plen;
    const char *child;
    size_t clen;
    const char **suffixes;
    size_t *suffix_lens;
    size_t nsuffixes;
    const char *primary;
    size_t primary_len;
    size_t key_min, key_max;
} PlainRule;

typedef struct {
    KeyFile *items;
    size_t count, cap;
    char *arena;
    size_t used, room;
} KeyFiles;

static int keyfiles_add(KeyFiles *k, const char *key, size_t len, long long size, int primary, int tree) {
    KeyFile *items = grow(k->items, &k->cap, k->count + 1, sizeof(KeyFile), 32);
    if (items == NULL) return -1;
    k->items = items;
    char *arena = grow(k->arena, &k->room, k->used + len, 1, 2048);
    if (arena == NULL) return -1;
    k->arena = arena;
    KeyFile *it = &k->items[k->count++];
    it->key = k->used;
    it->len = len;
    it->size = size;
    it->primary = primary;
    it->tree = tree;
    it->at = NULL;
    memcpy(k->arena + k->used, key, len);
    k->used += len;
    return 0;
}

static int is_lower_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

/* The key of a plain name (its length), or 0 when the name is not plain; ``*primary`` says
 * whether its suffix is the rule's primary. ShardDir.key_of's rule, on bytes: a name that is
 * not ASCII fails the hex test here as it does there. */
static size_t plain_key(const PlainRule *r, const char *name, size_t nlen, int *primary) {
    const char *dot = memchr(name, '.', nlen);
    if (dot == NULL) return 0;
    size_t klen = (size_t)(dot - name);
    if (klen < r->key_min || klen > r->key_max) return 0;
    const char *suffix = dot;
    size_t slen = nlen - klen;
    int known = 0;
    for (size_t i = 0; i < r->nsuffixes; i++) {
        if (r->suffix_lens[i] == slen && memcmp(r->suffixes[i], suffix, slen) == 0) {
            known = 1;
            break;
        }
    }
    if (!known) return 0;
    if (klen < r->plen + r->clen) return 0;
    if (memcmp(name, r->prefix, r->plen) != 0 || memcmp(name + r->plen, r->child, r->clen) != 0) return 0;
    if (!is_lower_hex(name, klen)) return 0;
    *primary = slen == r->primary_len && memcmp(suffix, r->primary, slen) == 0;
    return klen;
}

/* The child ``name`` of ``parent``, opened as the walk opens it (no symlink followed), or NULL. */
static DIR *open_child(int parent, const char *name) {
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return NULL;  /* gone, a link, unreadable: the ordinary listing says which */
    DIR *dir = fdopendir(fd);
    if (dir == NULL) close(fd);
    return dir;
}

/* The next regular file of ``dir`` for a count: 1 with ``*name`` and ``*st`` set, 0 at the end,
 * -1 when the directory holds what a count declines (a subdirectory, a link, a FIFO, a socket,
 * a device: the listing reports those; a file it cannot stat, a read error). It skips what
 * list_dir_nogil skips: a file removed between readdir and fstatat. */
static int next_plain_file(DIR *dir, const char **name, struct stat *st) {
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(dir);
        if (de == NULL) return errno != 0 ? -1 : 0;
        const char *fname = de->d_name;
        if (fname[0] == '.' && (fname[1] == '\0' || (fname[1] == '.' && fname[2] == '\0'))) continue;
        if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN) return -1;  /* a directory, a link, a FIFO... */
        if (fstatat(dirfd(dir), fname, st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT || errno == ENOTDIR) continue;
            return -1;
        }
        if (!S_ISREG(st->st_mode)) return -1;
        *name = fname;
        return 1;
    }
}

/* Add the files of ``name`` open below ``parent`` (``parents[tree]``) to ``k``. 0: every entry
 * plain so far; 1: declined (something not plain); -1: out of memory. */
static int plain_dir(int parent, int tree, const char *name, int holds_primary, const PlainRule *r, KeyFiles *k,
                     size_t *files) {
    DIR *dir = open_child(parent, name);
    if (dir == NULL) return 1;
    int result = 0, more;
    const char *fname;
    struct stat st;
    while ((more = next_plain_file(dir, &fname, &st)) == 1) {
        int primary = 0;
        size_t klen = plain_key(r, fname, strlen(fname), &primary);
        primary = primary && holds_primary;
        if (klen == 0 || (primary && st.st_size == 0)) {  /* not plain, or an empty primary (the layout's CORRUPT) */
            result = 1;
            break;
        }
        if (keyfiles_add(k, fname, klen, (long long)st.st_size, primary, tree) != 0) {
            result = -1;
            break;
        }
        (*files)++;
    }
    closedir(dir);
    return more < 0 && result == 0 ? 1 : result;
}

/* Groups a key's files (by length, then bytes: any total order would do). It compares the
 * keys through the items' own pointers: a comparator reading the arena from a static (as it
 * once did) is wrong once two threads count at once, and qsort_r is not in every libc. */
static int keyfile_cmp(const void *a, const void *b) {
    const KeyFile *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(x->at, y->at, x->len);
}

/* Count the entries of ``k`` (sorting it by key): 0 with the totals added, 1 when a key has no
 * primary. Needs no GIL. */
static int plain_totals(KeyFiles *k, long long *entries, long long *bytes) {
    for (size_t i = 0; i < k->count; i++) k->items[i].at = k->arena + k->items[i].key;
    qsort(k->items, k->count, sizeof(KeyFile), keyfile_cmp);
    long long n = 0, total = 0;
    size_t i = 0;
    while (i < k->count) {
        size_t j = i;
        int primary = 0;
        while (j < k->count && keyfile_cmp(&k->items[i], &k->items[j]) == 0) {
            primary |= k->items[j].primary;
            total += k->items[j].size;
            j++;
        }
        if (!primary) return 1;  /* a key without its primary file */
        n++;
        i = j;
    }
    *entries += n;
    *bytes += total;
    return 0;
}

/* Offer each entry of ``k`` (sorted by plain_totals, which found every key's primary) to
 * ``top``: its directory the child ``child`` of the first tree holding its primary
 * (``trees[i]``: the store path of ``parents[i]``). 0, or -1 when out of memory. No GIL. */
static int plain_top(const KeyFiles *k, Largest *top, const char *const *trees, const size_t *tree_lens,
                     const char *child, size_t clen) {
    size_t i = 0;
    while (i < k->count) {
        size_t j = i;
        long long total = 0;
        int tree = INT_MAX;
        while (j < k->count && keyfile_cmp(&k->items[i], &k->items[j]) == 0) {
            if (k->items[j].primary && k->items[j].tree < tree) tree = k->items[j].tree;
            total += k->items[j].size;
            j++;
        }
        const KeyFile *key = &k->items[i];
        if (largest_offer(top, trees[tree], tree_lens[tree], child, clen, key->at, key->len, total,
                          (long long)(j - i)) != 0) return -1;
        i = j;
    }
    return 0;
}

/* What one count_plain call works with once its arguments are read. The parents' store paths
 * are UTF-8 with surrogatepass (a str's code points, so memcmp orders them as Python orders
 * the strs), kept alive by ``held``; read only when a ``top`` is asked for. */
typedef struct {
    PlainRule rule;
    Py_ssize_t nparents;
    int fds[30], holds[30];
    const char *trees[30];
    size_t tree_lens[30];
    PyObject *held[30];
    Largest top;
    KeyFiles k;
    long long entries, bytes;
    size_t files;
} PlainCall;

static void plain_call_free(PlainCall *c) {
    free(c->rule.suffixes);
    free(c->rule.suffix_lens);
    for (Py_ssize_t i = 0; i < c->nparents; i++) Py_XDECREF(c->held[i]);
    largest_free(&c->top);
    free(c->k.items);
    free(c->k.arena);
}

/* The rule's strings (borrowed from the caller's str objects, alive for the call). 0, or -1. */
static int plain_call_rule(PlainCall *c, PyObject *prefix, PyObject *suffixes, PyObject *primary_suffix) {
    PlainRule *rule = &c->rule;
    Py_ssize_t nsuffixes = PyTuple_GET_SIZE(suffixes), slen;
    rule->suffixes = calloc((size_t)nsuffixes + 1, sizeof(char *));
    rule->suffix_lens = calloc((size_t)nsuffixes + 1, sizeof(size_t));
    if (rule->suffixes == NULL || rule->suffix_lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nsuffixes; i++) {
        PyObject *s = PyTuple_GET_ITEM(suffixes, i);
        if (!PyUnicode_Check(s)) {
            PyErr_SetString(PyExc_TypeError, "count_plain: suffixes must be str");
            return -1;
        }
        rule->suffixes[i] = PyUnicode_AsUTF8AndSize(s, &slen);
        if (rule->suffixes[i] == NULL) return -1;
        rule->suffix_lens[i] = (size_t)slen;
    }
    rule->nsuffixes = (size_t)nsuffixes;
    rule->prefix = PyUnicode_AsUTF8AndSize(prefix, &slen);
    if (rule->prefix == NULL) return -1;
    rule->plen = (size_t)slen;
    rule->primary = PyUnicode_AsUTF8AndSize(primary_suffix, &slen);
    if (rule->primary == NULL) return -1;
    rule->primary_len = (size_t)slen;
    return 0;
}

/* The parents' descriptors and primary flags, and (for a ``top``) their store paths
 * (``directories``, NULL when not given). 0, or -1. */
static int plain_call_parents(PlainCall *c, PyObject *parents, PyObject *primary, PyObject *directories) {
    if (c->top.limit > 0 && (directories == NULL || PyTuple_GET_SIZE(directories) != c->nparents)) {
        PyErr_SetString(PyExc_ValueError, "count_plain: a top needs the directories of the parents");
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->nparents; i++) {
        c->fds[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(parents, i));
        c->holds[i] = PyObject_IsTrue(PyTuple_GET_ITEM(primary, i));
        if ((c->fds[i] == -1 || c->holds[i] < 0) && PyErr_Occurred()) return -1;
        if (c->top.limit == 0) continue;
        PyObject *path = PyTuple_GET_ITEM(directories, i);
        if (!PyUnicode_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "count_plain: directories must be str");
            return -1;
        }
        c->held[i] = PyUnicode_AsEncodedString(path, "utf-8", "surrogatepass");
        if (c->held[i] == NULL) return -1;
        c->trees[i] = PyBytes_AS_STRING(c->held[i]);
        c->tree_lens[i] = (size_t)PyBytes_GET_SIZE(c->held[i]);
    }
    return 0;
}

/* Count the child ``name`` (in the parents of ``mask``'s bits), or add it to ``declined``.
 * The directories are read, and the keys sorted and offered to the top, without the GIL.
 * 0, or -1 with an exception set. */
static int plain_call_child(PlainCall *c, PyObject *name, long mask, PyObject *declined) {
    PyObject *raw = PyUnicode_EncodeFSDefault(name);  /* for openat */
    PyObject *text = c->top.limit ? PyUnicode_AsEncodedString(name, "utf-8", "surrogatepass") : NULL;  /* for top */
    if (raw == NULL || (c->top.limit && text == NULL)) {
        Py_XDECREF(raw);
        Py_XDECREF(text);
        return -1;
    }
    c->rule.child = PyBytes_AS_STRING(raw);
    c->rule.clen = (size_t)PyBytes_GET_SIZE(raw);
    const char *child = text ? PyBytes_AS_STRING(text) : NULL;
    size_t clen = text ? (size_t)PyBytes_GET_SIZE(text) : 0;
    c->k.count = 0;
    c->k.used = 0;
    size_t child_files = 0;
    int verdict = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < c->nparents && verdict == 0; i++) {
        if (mask & (1L << i)) verdict = plain_dir(c->fds[i], (int)i, c->rule.child, c->holds[i], &c->rule, &c->k,
                                                  &child_files);
    }
    if (verdict == 0) verdict = plain_totals(&c->k, &c->entries, &c->bytes);
    if (verdict == 0 && c->top.limit > 0) verdict = plain_top(&c->k, &c->top, c->trees, c->tree_lens, child, clen);
    Py_END_ALLOW_THREADS
    Py_DECREF(raw);
    Py_XDECREF(text);
    if (verdict < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (verdict != 0) return PyList_Append(declined, name);
    c->files += child_files;
    return 0;
}

PyDoc_STRVAR(count_plain_doc,
"count_plain(parents, primary, children, prefix, suffixes, primary_suffix, key_min, key_max,\n"
"            largest=0, directories=()) -> (entries, bytes, files, declined, top)\n\n"
"Count the plain entries of children of a level open in several trees (``parents``: their\n"
"descriptors, not closed; ``primary``: whether each holds primary files). ``children`` are\n"
"(name, mask) pairs, bit i of the mask set when ``parents[i]`` has that child as a\n"
"subdirectory. A child is counted when all its files are plain (the module comment above\n"
"count_plain says what that is); its name is in ``declined`` otherwise, and nothing of it is\n"
"counted. ``top``: the ``largest`` (0 to 10000) entries counted, as (directory, key, bytes,\n"
"files), by bytes descending, then directory, then key. ``key`` is the file names' part before\n"
"the first dot; ``bytes`` and ``files`` are all its files' in every tree; ``directory`` is the\n"
"child's store path in the first parent holding its primary file, given ``directories`` (the\n"
"parents' store paths, needed when ``largest`` is not 0).");

static PyObject *count_plain(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *parents, *primary, *children, *prefix, *suffixes, *primary_suffix, *largest = NULL;
    PyObject *directories = NULL;
    Py_ssize_t key_min, key_max;
    if (!PyArg_ParseTuple(args, "O!O!O!UO!Unn|OO!:count_plain", &PyTuple_Type, &parents, &PyTuple_Type, &primary,
                          &PyList_Type, &children, &prefix, &PyTuple_Type, &suffixes, &primary_suffix,
                          &key_min, &key_max, &largest, &PyTuple_Type, &directories)) return NULL;
    PlainCall c = {0};
    c.nparents = PyTuple_GET_SIZE(parents);
    if (c.nparents != PyTuple_GET_SIZE(primary) || c.nparents > 30 || key_min < 1 || key_max < key_min) {
        PyErr_SetString(PyExc_ValueError, "count_plain: parents and primary differ, or bad key bounds");
        return NULL;
    }
    c.rule.key_min = (size_t)key_min;
    c.rule.key_max = (size_t)key_max;
    PyObject *declined = PyList_New(0), *out = NULL;
    if (declined == NULL) return NULL;
    if (largest != NULL && check_largest(largest, "count_plain: largest", &c.top.limit) != 0) goto done;
    if (plain_call_parents(&c, parents, primary, directories) != 0) goto done;
    if (plain_call_rule(&c, prefix, suffixes, primary_suffix) != 0) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(children); i++) {
        PyObject *name;
        long mask;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(children, i), "Ul:count_plain child", &name, &mask)) goto done;
        if (plain_call_child(&c, name, mask, declined) != 0) goto done;
    }
    PyObject *top = largest_list(&c.top, 0);
    if (top != NULL) out = Py_BuildValue("(LLnON)", c.entries, c.bytes, (Py_ssize_t)c.files, declined, top);
done:
    plain_call_free(&c);
    Py_DECREF(declined);
    return out;
}

/* ---- Entry directories counted, not listed (layout A) -----------------------------------
 *
 * The walk's counterpart of count_plain for layouts whose entries are directories (layout A:
 * one directory an entry; the file names are the layout's, in the rule). Asked by its caller
 * (``Walker.count_children``, right after the walk yielded a directory and before it goes
 * below it), each child named ``prefix`` plus one or more characters of ``charset`` is one
 * entry, counted when its directory holds only regular files, each named one of ``names``,
 * with every name of ``required`` present and ``primary`` not empty. A child with anything
 * else (a subdirectory, a link, another name, a temp file, an empty primary, a missing
 * required file, a directory that cannot be opened or read) is walked as before. Asked for
 * its ``largest`` entries, the count keeps them (a ``top``, see above): an entry directory's
 * store path, its name as the key, its files' bytes and number. */

typedef struct {
    const char *prefix;
    size_t plen;
    const char *charset;
    const char **names;
    size_t nnames;
    unsigned long required;  /* bit i: names[i] must be present */
    size_t primary;  /* index of the primary in names */
} EntryRule;

static int entry_child(const EntryRule *r, const char *name, size_t len) {
    if (len <= r->plen || memcmp(name, r->prefix, r->plen) != 0) return 0;
    for (size_t i = r->plen; i < len; i++) {
        if (name[i] == '\0' || strchr(r->charset, name[i]) == NULL) return 0;
    }
    return 1;
}

/* 0: the child ``name`` of ``parent`` is a plain entry of ``*bytes`` in ``*files``; 1: declined. */
static int entry_dir(int parent, const char *name, const EntryRule *r, long long *bytes, size_t *files) {
    DIR *dir = open_child(parent, name);
    if (dir == NULL) return 1;
    unsigned long seen = 0;
    long long total = 0;
    size_t count = 0;
    int result = 0, more;
    const char *fname;
    struct stat st;
    while ((more = next_plain_file(dir, &fname, &st)) == 1) {
        size_t i = 0;
        while (i < r->nnames && strcmp(r->names[i], fname) != 0) i++;
        if (i == r->nnames || (i == r->primary && st.st_size == 0)) {
            result = 1;
            break;
        }
        seen |= 1UL << i;
        total += (long long)st.st_size;
        count++;
    }
    closedir(dir);
    if (more < 0 || result != 0 || (seen & r->required) != r->required) return 1;
    *bytes = total;
    *files = count;
    return 0;
}

/* The rule of ``count_children``'s arguments read into ``r``: its strings are borrowed from
 * the arguments, which the caller holds for as long as ``r`` is used. 0, or -1 with an
 * exception set. */
static int entry_rule_read(PyObject *prefix, PyObject *charset, PyObject *names, PyObject *required,
                           PyObject *primary, EntryRule *r) {
    if (!PyUnicode_Check(prefix) || !PyUnicode_Check(charset) || !PyTuple_Check(names) || !PyTuple_Check(required)
        || !PyUnicode_Check(primary) || PyTuple_GET_SIZE(names) >= (Py_ssize_t)(8 * sizeof(unsigned long))) {
        PyErr_SetString(PyExc_TypeError, "count_children: a PlainEntryDirs's fields: str, str, a tuple of str "
                        "(fewer than 64), a tuple of str, str");
        return -1;
    }
    Py_ssize_t plen;
    r->prefix = PyUnicode_AsUTF8AndSize(prefix, &plen);
    r->charset = PyUnicode_AsUTF8(charset);
    if (r->prefix == NULL || r->charset == NULL) return -1;
    r->plen = (size_t)plen;
    r->nnames = (size_t)PyTuple_GET_SIZE(names);
    r->names = calloc(r->nnames + 1, sizeof(char *));
    if (r->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->primary = r->nnames;
    for (size_t i = 0; i < r->nnames; i++) {
        PyObject *n = PyTuple_GET_ITEM(names, (Py_ssize_t)i);
        if (!PyUnicode_Check(n) || (r->names[i] = PyUnicode_AsUTF8(n)) == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "count_children: names must be str");
            return -1;
        }
        if (PyUnicode_Compare(n, primary) == 0) r->primary = i;
        int needed = PySequence_Contains(required, n);
        if (needed < 0) return -1;
        if (needed) r->required |= 1UL << i;
    }
    if (r->primary == r->nnames || (size_t)__builtin_popcountl(r->required) != (size_t)PyTuple_GET_SIZE(required)) {
        PyErr_SetString(PyExc_ValueError, "count_children: the primary and every required name must be among names");
        return -1;
    }
    return 0;
}

/* ---- Walker: the depth-first walk of local_listing.walk, one directory per __next__ ------
 *
 * The walker calls nothing back: it holds no Python callable, and what its caller decides
 * about a directory (a walk plan's answers: count these children, walk that held-back one) it
 * is told in band, between two steps. After each step that yields a directory's own listing,
 * that directory's subdirectories are still unvisited and not yet Python objects (they wait
 * as the raw listing, ``Frame.pending``): ``count_children`` counts the ones a rule covers
 * (they are then never walked and never become objects: a namespace of a million entry
 * directories costs no object per counted one), and ``release`` hands back a held one. The
 * next step settles the rest into the list it walks. */

/* Directory levels below the root the walk enters: local_listing.MAX_DEPTH (its docstring says
 * why; tests/stores/test_listing_paths.py checks the two are equal through the module's MAX_DEPTH). */
#define MAX_DEPTH 128

typedef struct {
    int fd;
    char *rel;  /* the directory's store path (bytes, no trailing "/") */
    size_t rlen;
    size_t slashes;  /* "/" in rel: a child's rel has one more, unless rel is the root ("") */
    Listing pending;  /* while ``unsettled``: the directory's listing, its subdirectories KIND_PENDING/HELD */
    int unsettled;
    PyObject *subdirs;  /* once settled: list of bytes names still to visit */
    Py_ssize_t next;
} Frame;

/* A GC type, though it holds no callable any more (only its FileInfo type, the held names and
 * lists of bytes): cheap, and a subclass or a future field cannot bring the cycle back that a
 * walker holding its caller's callbacks once made, with every descriptor of the walk open. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *info_type;
    PyObject *held;  /* tuple of bytes names: subdirectories not entered unless released, or NULL */
    int steered;  /* yield a directory with subdirectories even when it has no files (to count them) */
    Frame *frames;
    size_t depth, cap;
    int started;
    int steer;  /* the last step yielded the top frame's own listing: it may be steered until the next */
    int running;  /* inside a step or a count (the GIL is released meanwhile): no other call may enter */
} Walker;

static void frame_close(Frame *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    free(f->rel);
    f->rel = NULL;
    listing_free(&f->pending);
    f->unsettled = 0;
    Py_CLEAR(f->subdirs);
}

static void walker_pop(Walker *w) {
    frame_close(&w->frames[--w->depth]);
}

static int walker_traverse(Walker *w, visitproc visit, void *arg) {
    Py_VISIT(w->info_type);
    Py_VISIT(w->held);
    for (size_t i = 0; i < w->depth; i++) Py_VISIT(w->frames[i].subdirs);
    return 0;
}

/* The walk is over (its descriptors closed now, not at some later collection), and a step
 * after this one, from a finalizer, ends it (started, no frame left). */
static int walker_clear(Walker *w) {
    while (w->depth) walker_pop(w);
    w->started = 1;
    w->steer = 0;
    Py_CLEAR(w->info_type);
    Py_CLEAR(w->held);
    return 0;
}

static void walker_dealloc(Walker *w) {
    PyObject_GC_UnTrack(w);
    walker_clear(w);
    free(w->frames);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* Push the directory open as ``fd`` whose store path is ``rel``. ``fd`` is consumed: the new
 * frame's, or closed here when it cannot be pushed, so every caller closes it exactly once.
 * 0, or -1 with MemoryError set. */
static int walker_push(Walker *w, int fd, const char *rel, size_t rlen) {
    if (w->depth == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 16;
        Frame *frames = realloc(w->frames, cap * sizeof(Frame));
        if (frames == NULL) goto fail;
        w->frames = frames;
        w->cap = cap;
    }
    Frame *f = &w->frames[w->depth];
    memset(f, 0, sizeof(*f));
    f->rel = malloc(rlen + 1);
    if (f->rel == NULL) goto fail;
    memcpy(f->rel, rel, rlen);
    f->rel[rlen] = '\0';
    f->rlen = rlen;
    for (size_t i = 0; i < rlen; i++) f->slashes += rel[i] == '/';
    f->fd = fd;
    w->depth++;
    return 0;
fail:
    close(fd);
    PyErr_NoMemory();
    return -1;
}

static PyObject *decode(const char *s, size_t n) {
    return PyUnicode_DecodeFSDefaultAndSize(s, (Py_ssize_t)n);
}

/* Whether ``name`` is one of the walker's held names. */
static int is_held(const Walker *w, const char *name, size_t len) {
    if (w->held == NULL) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(w->held); i++) {
        PyObject *h = PyTuple_GET_ITEM(w->held, i);
        if ((size_t)PyBytes_GET_SIZE(h) == len && memcmp(PyBytes_AS_STRING(h), name, len) == 0) return 1;
    }
    return 0;
}

/* Settle the frame's subdirectories still pending into the list the walk visits (held ones
 * not released stay out) and free its listing. 0, or -1 with an exception set. */
static int frame_settle(Frame *f) {
    PyObject *subdirs = PyList_New(0);
    if (subdirs == NULL) return -1;
    for (size_t i = 0; i < f->pending.count; i++) {
        const Item *it = &f->pending.items[i];
        if (it->kind != KIND_PENDING) continue;
        PyObject *name = PyBytes_FromStringAndSize(f->pending.arena + it->name, (Py_ssize_t)it->len);
        if (name == NULL || PyList_Append(subdirs, name) != 0) {
            Py_XDECREF(name);
            Py_DECREF(subdirs);
            return -1;
        }
        Py_DECREF(name);
    }
    listing_free(&f->pending);
    f->unsettled = 0;
    f->subdirs = subdirs;
    f->next = 0;
    return 0;
}

/* List the top frame's directory: (rel, names, files, links, problems, fd, pending, held) to
 * yield, or Py_None when it has nothing to report (no file, no link, no held subdirectory, and
 * for a steered walk no subdirectory). The frame is left unsettled either way. When the
 * listing fails, returns NULL with no exception set and the errno value in ``*oserr``. */
static PyObject *walker_list_top(Walker *w, int *oserr) {
    Frame *f = &w->frames[w->depth - 1];
    Listing l = {0};
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = list_dir_nogil(f->fd, &l);
    Py_END_ALLOW_THREADS
    *oserr = 0;
    if (err) {
        listing_free(&l);
        if (err == ENOMEM) return PyErr_NoMemory();
        *oserr = err;
        return NULL;
    }
    size_t pending = 0;
    PyObject *held = NULL;  /* made for the first held subdirectory: most directories have none */
    for (size_t i = 0; i < l.count; i++) {
        Item *it = &l.items[i];
        if (it->kind != KIND_DIR) continue;
        const char *name = l.arena + it->name;
        if (!is_held(w, name, it->len)) {
            it->kind = KIND_PENDING;
            pending++;
            continue;
        }
        it->kind = KIND_HELD;
        PyObject *uname = decode(name, it->len);
        if (uname == NULL || (held == NULL && (held = PyList_New(0)) == NULL) || PyList_Append(held, uname) != 0) {
            Py_XDECREF(uname);
            Py_XDECREF(held);
            listing_free(&l);
            return NULL;
        }
        Py_DECREF(uname);
    }
    char *prefix = malloc(f->rlen + 2);
    if (prefix == NULL) {
        Py_XDECREF(held);
        listing_free(&l);
        return PyErr_NoMemory();
    }
    memcpy(prefix, f->rel, f->rlen);
    size_t plen = f->rlen;
    if (plen) prefix[plen++] = '/';
    PyObject *built = build(&l, prefix, plen, w->info_type, 1);
    free(prefix);
    f->pending = l;  /* owned by the frame now: settled at the next step */
    f->unsettled = 1;
    if (built == NULL) {
        Py_XDECREF(held);
        return NULL;
    }
    PyObject *names = PyTuple_GET_ITEM(built, 1), *files = PyTuple_GET_ITEM(built, 2);
    PyObject *links = PyTuple_GET_ITEM(built, 3), *problems = PyTuple_GET_ITEM(built, 4);
    if (PyList_GET_SIZE(files) == 0 && PyList_GET_SIZE(links) == 0 && PyTuple_GET_SIZE(problems) == 0
        && held == NULL && !(w->steered && pending)) {
        Py_DECREF(built);
        Py_RETURN_NONE;
    }
    /* A tuple: the empty one is CPython's shared singleton, no allocation per directory. */
    PyObject *kept = held == NULL ? PyTuple_New(0) : PyList_AsTuple(held);
    Py_XDECREF(held);
    PyObject *rel = kept == NULL ? NULL : decode(f->rel, f->rlen);
    if (rel == NULL) {
        Py_XDECREF(kept);
        Py_DECREF(built);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(NOOOOinN)", rel, names, files, links, problems, f->fd, (Py_ssize_t)pending,
                                  kept);
    Py_DECREF(built);
    if (out != NULL) w->steer = 1;
    return out;
}

/* The problem listing of an unopenable or unreadable child: (prel, [], [], [], ((name, reason),), -1, 0, ()).
 * ``reason`` is consumed, also when this fails. */
static PyObject *problem(Frame *parent, PyObject *name, PyObject *reason) {
    PyObject *rel = decode(parent->rel, parent->rlen);
    PyObject *uname = rel ? PyUnicode_DecodeFSDefaultAndSize(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name)) : NULL;
    if (uname == NULL) {
        Py_XDECREF(rel);
        Py_XDECREF(uname);
        Py_DECREF(reason);
        return NULL;
    }
    return Py_BuildValue("(N[][][]((NN))in())", rel, uname, reason, -1, (Py_ssize_t)0);
}

static PyObject *unreadable(int err) {
    return PyUnicode_FromFormat("unreadable directory (%s)", strerror(err));
}

/* Open the child ``name`` of the top frame ``f`` and push it. Returns 1 when pushed, 0 when
 * the child is gone (nothing to report), and otherwise NULL-or-problem in ``*out``: -1 with
 * ``*out`` the problem listing to yield (or NULL with an exception set). */
static int walker_enter(Walker *w, Frame *f, PyObject *name, PyObject **out) {
    const char *cname = PyBytes_AS_STRING(name);
    *out = NULL;
    if ((f->rlen ? f->slashes + 1 : 0) >= MAX_DEPTH) {  /* not opened: reported, as local_listing does */
        PyObject *reason = PyUnicode_FromFormat("nested more than %d directories deep (not listed)", MAX_DEPTH);
        *out = reason ? problem(f, name, reason) : NULL;
        return -1;
    }
    int cfd, err = 0;
    Py_BEGIN_ALLOW_THREADS
    cfd = openat(f->fd, cname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cfd < 0) err = errno;
    Py_END_ALLOW_THREADS
    if (cfd < 0) {
        PyObject *reason;
        if (err == ENOENT) return 0;
        if (err == ELOOP || err == ENOTDIR) {
            struct stat st;  /* SafeRoot.is_link: a link is reported, a file that replaced it skipped */
            if (fstatat(f->fd, cname, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(st.st_mode)) return 0;
            reason = PyUnicode_FromString("a symlinked directory (not followed)");
        } else {
            reason = unreadable(err);
        }
        *out = reason ? problem(f, name, reason) : NULL;
        return -1;
    }
    size_t nlen = (size_t)PyBytes_GET_SIZE(name);
    char *rel = malloc(f->rlen + nlen + 2);
    if (rel == NULL) {
        close(cfd);
        PyErr_NoMemory();
        return -1;
    }
    size_t rlen = 0;
    if (f->rlen) {
        memcpy(rel, f->rel, f->rlen);
        rel[f->rlen] = '/';
        rlen = f->rlen + 1;
    }
    memcpy(rel + rlen, cname, nlen);
    rlen += nlen;
    int pushed = walker_push(w, cfd, rel, rlen);  /* consumes cfd; may move the frames */
    free(rel);
    return pushed == 0 ? 1 : -1;
}

static PyObject *walker_step(Walker *w);

static PyObject *walker_next(Walker *w) {
    if (w->running) {
        PyErr_SetString(PyExc_RuntimeError, "Walker is already running");
        return NULL;
    }
    w->running = 1;
    w->steer = 0;
    PyObject *out = walker_step(w);
    w->running = 0;
    return out;
}

static PyObject *walker_step(Walker *w) {
    if (!w->started) {
        w->started = 1;
        int oserr;
        PyObject *out = walker_list_top(w, &oserr);
        if (out == NULL) {
            while (w->depth) walker_pop(w);
            return oserr ? raise_errno(oserr) : NULL;  /* the start itself: raised, as walk() does */
        }
        if (out != Py_None) return out;
        Py_DECREF(out);
    }
    while (w->depth) {
        Frame *f = &w->frames[w->depth - 1];
        if (f->unsettled && frame_settle(f) != 0) return NULL;
        if (f->subdirs == NULL || f->next >= PyList_GET_SIZE(f->subdirs)) {
            walker_pop(w);
            continue;
        }
        PyObject *name = PyList_GET_ITEM(f->subdirs, f->next++);
        Py_INCREF(name);
        PyObject *out;
        int entered = walker_enter(w, f, name, &out);
        if (entered == 0) {
            Py_DECREF(name);
            continue;
        }
        if (entered < 0) {
            Py_DECREF(name);
            return out;
        }
        int oserr;
        out = walker_list_top(w, &oserr);
        if (out == NULL) {
            if (!oserr) {
                Py_DECREF(name);
                return NULL;
            }
            /* Unreadable: reported against the parent, as the Python walk does. */
            walker_pop(w);
            PyObject *reason = unreadable(oserr);
            out = reason ? problem(&w->frames[w->depth - 1], name, reason) : NULL;
            Py_DECREF(name);
            return out;
        }
        Py_DECREF(name);
        if (out != Py_None) return out;
        Py_DECREF(out);
    }
    return NULL;  /* StopIteration */
}

/* The top frame, when the walker may be steered now (right after a step that yielded its own
 * listing); else NULL with RuntimeError set, naming ``what`` was asked. */
static Frame *steerable(Walker *w, const char *what) {
    if (w->running) {
        PyErr_Format(PyExc_RuntimeError, "Walker.%s: the walker is running", what);
        return NULL;
    }
    if (!w->steer || w->depth == 0 || !w->frames[w->depth - 1].unsettled) {
        PyErr_Format(PyExc_RuntimeError, "Walker.%s: only right after a step that yielded a directory's own "
                     "listing, before the next step", what);
        return NULL;
    }
    return &w->frames[w->depth - 1];
}

/* What the counted children of one directory add up to. */
typedef struct {
    size_t entries, files;
    long long bytes;
    Largest top;
} EntryCount;

/* Count the pending children of ``f`` that ``r`` covers and drop them (kind 0), keeping the
 * largest in ``c->top``; without the GIL. 0, or -1 out of memory. */
static int entry_dirs_count(Frame *f, const EntryRule *r, EntryCount *c) {
    Listing *l = &f->pending;
    for (size_t i = 0; i < l->count; i++) {
        Item *it = &l->items[i];
        const char *name = l->arena + it->name;
        long long size;
        size_t files;
        if (it->kind != KIND_PENDING || !entry_child(r, name, it->len) || entry_dir(f->fd, name, r, &size, &files) != 0) {
            continue;
        }
        it->kind = 0;  /* counted: not walked, no object made */
        c->entries++;
        c->files += files;
        c->bytes += size;
        if (largest_offer(&c->top, f->rel, f->rlen, name, it->len, name, it->len, size, (long long)files) != 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *walker_count_children(Walker *w, PyObject *args) {
    PyObject *prefix, *charset, *names, *required, *primary, *largest;
    if (!PyArg_ParseTuple(args, "OOOOOO:count_children", &prefix, &charset, &names, &required, &primary, &largest)) {
        return NULL;
    }
    Frame *f = steerable(w, "count_children");
    if (f == NULL) return NULL;
    EntryRule r = {0};
    EntryCount c = {0};
    PyObject *out = NULL;
    int nomem;
    if (check_largest(largest, "count_children: largest", &c.top.limit) != 0) goto done;
    if (entry_rule_read(prefix, charset, names, required, primary, &r) != 0) goto done;
    w->running = 1;  /* the GIL is released: no step and no other count may enter meanwhile */
    Py_BEGIN_ALLOW_THREADS
    nomem = entry_dirs_count(f, &r, &c);
    Py_END_ALLOW_THREADS
    w->running = 0;
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *top = largest_list(&c.top, 1);
    if (top != NULL) out = Py_BuildValue("(nLnN)", (Py_ssize_t)c.entries, c.bytes, (Py_ssize_t)c.files, top);
done:
    free(r.names);
    largest_free(&c.top);
    return out;
}

static PyObject *walker_release(Walker *w, PyObject *name) {
    Frame *f = steerable(w, "release");
    if (f == NULL) return NULL;
    PyObject *raw = PyUnicode_Check(name) ? PyUnicode_EncodeFSDefault(name) : NULL;
    if (raw == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "Walker.release: a str name");
        return NULL;
    }
    const char *cname = PyBytes_AS_STRING(raw);
    size_t len = (size_t)PyBytes_GET_SIZE(raw);
    for (size_t i = 0; i < f->pending.count; i++) {
        Item *it = &f->pending.items[i];
        if (it->kind == KIND_HELD && it->len == len && memcmp(f->pending.arena + it->name, cname, len) == 0) {
            it->kind = KIND_PENDING;
            Py_DECREF(raw);
            Py_RETURN_NONE;
        }
    }
    Py_DECREF(raw);
    PyErr_Format(PyExc_KeyError, "Walker.release: %R is not a held subdirectory of the directory just listed", name);
    return NULL;
}

/* The held names as a tuple of bytes (or NULL for none): 0, or -1 with TypeError set. */
static int read_held(PyObject *held, PyObject **out) {
    *out = NULL;
    if (held == Py_None) return 0;
    if (!PyFrozenSet_Check(held)) {
        PyErr_SetString(PyExc_TypeError, "Walker: held must be a frozenset of bytes names");
        return -1;
    }
    PyObject *names = PySequence_Tuple(held);
    if (names == NULL) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *n = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(n) || PyBytes_GET_SIZE(n) == 0 || memchr(PyBytes_AS_STRING(n), '/', (size_t)PyBytes_GET_SIZE(n))) {
            PyErr_SetString(PyExc_TypeError, "Walker: held must be a frozenset of bytes names (non-empty, no '/')");
            Py_DECREF(names);
            return -1;
        }
    }
    *out = names;
    return 0;
}

/* A Walker of parsed arguments. ``fd`` is consumed: the walk's, or closed here when the walker
 * cannot be made. */
static PyObject *walker_make(PyTypeObject *type, int fd, PyObject *start, PyObject *info_type, PyObject *held,
                             int steered) {
    PyObject *raw = NULL, *names = NULL;
    Walker *w = NULL;
    if (check_info_type(info_type) != 0 || read_held(held, &names) != 0) goto refused;
    raw = PyUnicode_EncodeFSDefault(start);
    if (raw == NULL) goto refused;
    w = (Walker *)type->tp_alloc(type, 0);
    if (w == NULL) goto refused;
    Py_INCREF(info_type);
    w->info_type = (PyTypeObject *)info_type;
    w->held = names;  /* the walker's reference now */
    names = NULL;
    w->steered = steered;
    int pushed = walker_push(w, fd, PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw));  /* consumes fd */
    Py_DECREF(raw);
    if (pushed != 0) {
        Py_DECREF(w);
        return NULL;
    }
    return (PyObject *)w;
refused:
    Py_XDECREF(raw);
    Py_XDECREF(names);
    if (fd >= 0) close(fd);
    return NULL;
}

static PyObject *walker_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int fd = -1, steered = 0;
    PyObject *start, *info_type, *held = Py_None;
    static char *kwlist[] = {"fd", "start", "info_type", "held", "steered", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iUO|Op:Walker", kwlist, &fd, &start, &info_type, &held, &steered)) {
        if (fd >= 0) close(fd);  /* parsed before the argument that failed: handed over all the same */
        return NULL;
    }
    return walker_make(type, fd, start, info_type, held, steered);
}

static PyObject *walker_close(Walker *w, PyObject *unused) {
    (void)unused;
    if (w->running) {
        PyErr_SetString(PyExc_RuntimeError, "Walker is running: close it after the step");
        return NULL;
    }
    while (w->depth) walker_pop(w);
    w->steer = 0;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(count_children_doc,
"count_children(prefix, charset, names, required, primary, largest) -> (entries, bytes, files, top)\n\n"
"Right after a step that yielded a directory's own listing: count its subdirectories that the\n"
"rule (a PlainEntryDirs's fields) covers, which the walk then never enters. ``top``: the\n"
"``largest`` (0 to 10000) counted entries as (directory, key, bytes, files), the key the entry\n"
"directory's name, by bytes descending, then directory, then key.");

static PyMethodDef walker_methods[] = {
    {"close", (PyCFunction)walker_close, METH_NOARGS, "Close every descriptor the walk holds."},
    {"count_children", (PyCFunction)walker_count_children, METH_VARARGS, count_children_doc},
    {"release", (PyCFunction)walker_release, METH_O,
     "release(name): right after a step that yielded a directory's own listing, walk its held\n"
     "subdirectory ``name`` after all."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(walker_doc,
"Walker(fd, start, info_type, held=None, steered=False)\n\n"
"Depth first from the open directory ``fd`` (consumed: closed by the walk, or at once when the\n"
"Walker cannot be made) whose store path is ``start``. Yields (rel, names, files, links,\n"
"problems, fd, pending, held) per directory with files, links, held subdirectories or (when\n"
"``steered``) subdirectories; ``fd`` is the listed directory's descriptor, valid until the next\n"
"step (-1 for a problem listing); ``pending`` the number of its subdirectories the walk will\n"
"enter, ``held`` the names of those it will not: a subdirectory whose name (bytes) is in\n"
"``held`` (a frozenset) is left alone, unopened, unless ``release(name)`` is called before the\n"
"next step. Symlinks are never followed; a subdirectory that cannot be opened or listed is a\n"
"problem of its parent's, worded as local_listing.dir_problem words it. Between two steps,\n"
"``count_children`` may count a directory's entry subdirectories instead of walking them. The\n"
"walker calls nothing back.");

static PyTypeObject WalkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "neffcache.stores._listdir.Walker",
    .tp_basicsize = sizeof(Walker),
    .tp_dealloc = (destructor)walker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)walker_traverse,
    .tp_clear = (inquiry)walker_clear,
    .tp_free = PyObject_GC_Del,
    .tp_doc = walker_doc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)walker_next,
    .tp_methods = walker_methods,
    .tp_new = walker_new,
};

static PyMethodDef methods[] = {
    {"list_dir", list_dir, METH_VARARGS, list_dir_doc},
    {"count_plain", count_plain, METH_VARARGS, count_plain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "neffcache.stores._listdir",
    "The listing loop of a local scan in C (see neffcache/stores/local_listing.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__listdir(void) {
    if (PyType_Ready(&WalkerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&WalkerType);
    if (PyModule_AddObject(m, "Walker", (PyObject *)&WalkerType) < 0) {
        Py_DECREF(&WalkerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0
        || PyModule_AddIntConstant(m, "MAX_LARGEST", MAX_LARGEST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
