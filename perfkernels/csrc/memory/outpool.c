/* The output pool (see include/perfkernels/memory.h for the contract), linked into the
 * perfkernels._memory extension only.
 *
 * An idle block stores its list links in its own first bytes (it is ours and unused while idle,
 * and the smallest block is 64 bytes), so keeping a block costs no allocation.  Each idle block is
 * on two lists: its size class's (most recently freed first: the block handed out next is the one
 * most likely still in cache) and the pool-wide LRU list (eviction takes the least recently freed
 * block, whatever its class, so sizes a program stopped using leave the pool first).  Blocks are
 * given back to the system outside the lock.
 *
 * Baseline flags only; POSIX (Linux, macOS).
 */
/* -std=c11 hides POSIX and MAP_ANONYMOUS: ask for them */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1
#define _DARWIN_C_SOURCE 1

#include "perfkernels/memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif

/* Under AddressSanitizer the pool keeps nothing and allocates exactly the bytes asked for, so
 * ASan sees every output's true bounds and every use after its death (a cached, rounded-up block
 * would hide both). */
#if defined(__SANITIZE_ADDRESS__)
#define PK_POOL_SANITIZE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PK_POOL_SANITIZE 1
#endif
#endif
#ifndef PK_POOL_SANITIZE
#define PK_POOL_SANITIZE 0
#endif

#define SMALL_MAX 4096u            /* classes of 64 bytes up to here */
#define SMALL_CLASSES 64
#define STEPS_LOG2 3               /* then 2^STEPS_LOG2 classes per power of two */
#define N_CLASSES (SMALL_CLASSES + (63 - 12) * (1 << STEPS_LOG2))

typedef struct node {
    struct node *next, *prev;          /* its class's list */
    struct node *lru_next, *lru_prev;  /* the pool-wide list: head = most recently freed */
    size_t size;                       /* its capacity (class size) */
    int cls;
} node;

static struct {
    pthread_mutex_t lock;
    node *heads[N_CLASSES];
    node *lru_head, *lru_tail;
    pk_pool_stats stats;
} P = {PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0, {(uint64_t)256 << 20, 0, 0, 0, 0, 0, 0, 0}};

/* ---- size classes ---------------------------------------------------------------------------- */

static int log2_floor(size_t x) {   /* x > 0 */
    return 63 - __builtin_clzll((unsigned long long)x);
}

/* The class index of `bytes` (> 0) and its capacity; -1 when it is too large for any class. */
static int class_of(size_t bytes, size_t *cap) {
    if (bytes <= SMALL_MAX) {
        int idx = (int)((bytes + 63) / 64) - 1;
        *cap = (size_t)(idx + 1) * 64;
        return idx;
    }
    int p = log2_floor(bytes - 1);      /* 2^p < bytes <= 2^(p + 1), p >= 12 */
    if (p >= 63)
        return -1;
    int shift = p - STEPS_LOG2;
    size_t m = (bytes + ((size_t)1 << shift) - 1) >> shift;   /* 2^S < m <= 2^(S + 1) */
    *cap = m << shift;
    return SMALL_CLASSES + (p - 12) * (1 << STEPS_LOG2) + (int)(m - ((size_t)1 << STEPS_LOG2) - 1);
}

size_t pk_pool_class_size(size_t bytes) {
    size_t cap = 0;
    if (bytes == 0 || class_of(bytes, &cap) < 0)
        return bytes;
    return cap;
}

/* ---- the system side ------------------------------------------------------------------------- */

static void *system_alloc(size_t cap) {
    void *p = NULL;
    if (cap >= PK_POOL_MMAP_MIN) {
        p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    return posix_memalign(&p, PK_POOL_ALIGN, cap) == 0 ? p : NULL;
}

static void system_free(void *p, size_t cap) {
    if (cap >= PK_POOL_MMAP_MIN)
        munmap(p, cap);
    else
        free(p);
}

/* ---- the lists (lock held) ------------------------------------------------------------------- */

static void unlink_node(node *n) {
    if (n->prev) n->prev->next = n->next; else P.heads[n->cls] = n->next;
    if (n->next) n->next->prev = n->prev;
    if (n->lru_prev) n->lru_prev->lru_next = n->lru_next; else P.lru_head = n->lru_next;
    if (n->lru_next) n->lru_next->lru_prev = n->lru_prev; else P.lru_tail = n->lru_prev;
    P.stats.cached_bytes -= n->size;
    P.stats.cached_blocks -= 1;
}

static void push_node(node *n) {
    n->prev = NULL;
    n->next = P.heads[n->cls];
    if (n->next) n->next->prev = n;
    P.heads[n->cls] = n;
    n->lru_prev = NULL;
    n->lru_next = P.lru_head;
    if (n->lru_next) n->lru_next->lru_prev = n; else P.lru_tail = n;
    P.lru_head = n;
    P.stats.cached_bytes += n->size;
    P.stats.cached_blocks += 1;
}

/* Unlink least recently freed blocks until the idle bytes are at most `limit`; returns them as a
 * list through `next`, to be freed after the lock is released. */
static node *evict_to(uint64_t limit) {
    node *out = NULL;
    while (P.stats.cached_bytes > limit && P.lru_tail) {
        node *n = P.lru_tail;
        unlink_node(n);
        P.stats.released_bytes += n->size;
        n->next = out;
        out = n;
    }
    return out;
}

static void free_list(node *n) {
    while (n) {
        node *next = n->next;
        system_free(n, n->size);
        n = next;
    }
}

/* ---- the API ---------------------------------------------------------------------------------- */

int pk_pool_sanitized(void) { return PK_POOL_SANITIZE; }

void *pk_pool_get(size_t bytes) {
    size_t cap;
    int cls;
    if (bytes == 0)
        bytes = 1;
    cls = class_of(bytes, &cap);
    if (cls < 0)
        return NULL;
    if (PK_POOL_SANITIZE) {
        void *p = NULL;
        if (posix_memalign(&p, PK_POOL_ALIGN, bytes) != 0)
            return NULL;
        pthread_mutex_lock(&P.lock);
        P.stats.misses += 1;
        P.stats.live_bytes += cap;
        P.stats.live_blocks += 1;
        pthread_mutex_unlock(&P.lock);
        return p;
    }
    pthread_mutex_lock(&P.lock);
    node *n = P.heads[cls];
    size_t trim = 0;
    if (!n && cap >= PK_POOL_MMAP_MIN) {
        /* No idle block of this class: a mapped block of up to twice the size (the next
         * classes) is cut to this one's capacity, its tail unmapped, rather than a new mapping
         * whose every page faults when first written (outputs whose size varies call to call,
         * a server's batches, would otherwise miss until each class had a block of its own).
         * The capacities of mapped classes are multiples of the page size. */
        for (int c = cls + 1; c <= cls + (1 << STEPS_LOG2) && c < N_CLASSES && !n; c++)
            n = P.heads[c];
        if (n)
            trim = n->size - cap;
    }
    if (n) {
        unlink_node(n);
        P.stats.hits += 1;
        P.stats.released_bytes += trim;
    } else {
        P.stats.misses += 1;
    }
    P.stats.live_bytes += cap;
    P.stats.live_blocks += 1;
    pthread_mutex_unlock(&P.lock);
    if (n) {
        if (trim)
            munmap((char *)n + cap, trim);
        return n;
    }
    void *p = system_alloc(cap);
    if (p == NULL) {                 /* out of memory: give the idle blocks back, try once more */
        pk_pool_release();
        p = system_alloc(cap);
        if (p == NULL) {
            pthread_mutex_lock(&P.lock);
            P.stats.live_bytes -= cap;
            P.stats.live_blocks -= 1;
            pthread_mutex_unlock(&P.lock);
        }
    }
    return p;
}

void pk_pool_put(void *ptr, size_t bytes) {
    size_t cap = 0;
    int cls;
    node *evicted;
    if (ptr == NULL)
        return;
    if (bytes == 0)
        bytes = 1;
    cls = class_of(bytes, &cap);   /* >= 0: pk_pool_get handed this size out */
    pthread_mutex_lock(&P.lock);
    P.stats.live_bytes -= cap;
    P.stats.live_blocks -= 1;
    if (PK_POOL_SANITIZE) {
        P.stats.released_bytes += cap;
        pthread_mutex_unlock(&P.lock);
        free(ptr);
        return;
    }
    if (cap > P.stats.limit) {       /* larger than the whole bound: not kept */
        P.stats.released_bytes += cap;
        pthread_mutex_unlock(&P.lock);
        system_free(ptr, cap);
        return;
    }
    node *n = (node *)ptr;
    n->size = cap;
    n->cls = cls;
    push_node(n);
    evicted = evict_to(P.stats.limit);
    pthread_mutex_unlock(&P.lock);
    free_list(evicted);
}

uint64_t pk_pool_release(void) {
    pthread_mutex_lock(&P.lock);
    uint64_t before = P.stats.cached_bytes;
    node *evicted = evict_to(0);
    pthread_mutex_unlock(&P.lock);
    free_list(evicted);
    return before;
}

uint64_t pk_pool_set_limit(uint64_t limit) {
    pthread_mutex_lock(&P.lock);
    uint64_t old = P.stats.limit;
    P.stats.limit = limit;
    node *evicted = evict_to(limit);
    pthread_mutex_unlock(&P.lock);
    free_list(evicted);
    return old;
}

void pk_pool_get_stats(pk_pool_stats *out) {
    pthread_mutex_lock(&P.lock);
    *out = P.stats;
    pthread_mutex_unlock(&P.lock);
}

/* ---- fork ------------------------------------------------------------------------------------- */

/* The lock is held across fork(), so the child never inherits it locked by a thread that does not
 * exist there; the child's copy of the lists and blocks is then its own pool. */
static void before_fork(void) { pthread_mutex_lock(&P.lock); }
static void after_fork(void) { pthread_mutex_unlock(&P.lock); }

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void register_fork(void) { pthread_atfork(before_fork, after_fork, after_fork); }

void pk_pool_init(void) { pthread_once(&fork_once, register_fork); }
