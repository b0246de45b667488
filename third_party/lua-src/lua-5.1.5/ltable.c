/*
** $Id: ltable.c,v 2.32.1.2 2007/12/28 15:32:23 roberto Exp $
** Lua tables (hash)
** See Copyright Notice in lua.h
*/


/*
** Implementation of tables (aka arrays, objects, or hash tables).
** Tables keep its elements in two parts: an array part and a hash part.
** Non-negative integer keys are all candidates to be kept in the array
** part. The actual size of the array is the largest `n' such that at
** least half the slots between 0 and n are in use.
** Hash uses a mix of chained scatter table with Brent's variation.
** A main invariant of these tables is that, if an element is not
** in its main position (i.e. the `original' position that its hash gives
** to it), then the colliding element is in its own main position.
** Hence even when the load factor reaches 100%, performance remains good.
*/

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define ltable_c
#define LUA_CORE

#include "lua.h"

#include "ldebug.h"
#include "ldo.h"
#include "lgc.h"
#include "lmem.h"
#include "lobject.h"
#include "lstate.h"
#include "ltable.h"


/*
** max size of array part is 2^MAXBITS
*/
#if LUAI_BITSINT > 26
#define MAXBITS		26
#else
#define MAXBITS		(LUAI_BITSINT-2)
#endif

#define MAXASIZE	(1 << MAXBITS)


#define hashpow2(t,n)      (gnode(t, lmod((n), sizenode(t))))
  
#define hashstr(t,str)  hashpow2(t, (str)->tsv.hash)
#define hashboolean(t,p)        hashpow2(t, p)


/*
** for some types, it is better to avoid modulus by power of 2, as
** they tend to have many 2 factors.
*/
#define hashmod(t,n)	(gnode(t, ((n) % ((sizenode(t)-1)|1))))


#define hashpointer(t,p)	hashmod(t, IntPoint(p))


/*
** fenced: hashing by creation id instead of address (third_party/README.md). Every table,
** closure, userdata and thread gets the next id of its state when made (`luaE_fencedid`),
** stored in the padding after its header bytes. A table made while the switch is on
** (`lua_fenced_ids`, turned on by fenced for the run of an entry under the rules that
** ask for it) is marked FENCED_IDMODE and places such keys by their ids: where they land,
** the order `next` visits them, when the table fills up and `#t` of one with holes are
** then functions of the order objects were made in — which fenced makes a function of the
** script by resetting the counter at the start of every run. Tables made while it is off
** (all of them under older rules) hash by address, exactly as before. Light userdata keep
** hashing by pointer (cjson.null is NULL). A table never changes mode, so lookups always
** agree with insertions. In an id-hashed table the steps along hash chains and the slots
** rehashed by a resize are charged too (ldo.c), since they no longer depend on addresses.
*/
#if !defined(__LP64__) && !defined(_WIN64)
#error "fenced's Lua patch assumes a 64-bit build: creation ids live in struct padding"
#endif

/* the sizes of unpatched Lua 5.1.5 on a 64-bit build: the ids took no room */
#define fenced_check(name, cond)	typedef char fenced_check_##name[(cond) ? 1 : -1]
fenced_check(table, sizeof(Table) == 64 && offsetof(Table, metatable) == 16);
fenced_check(cclosure, sizeof(CClosure) == 56 && offsetof(CClosure, gclist) == 16);
fenced_check(lclosure, sizeof(LClosure) == 48 && offsetof(LClosure, gclist) == 16);
fenced_check(closure, sizeof(Closure) == 56);
fenced_check(udata, sizeof(Udata) == 40 && offsetof(Udata, uv.metatable) == 16);
fenced_check(state, sizeof(lua_State) == 184 && offsetof(lua_State, top) == 16);
fenced_check(tstring, sizeof(TString) == 24 && sizeof(Node) == 40);
fenced_check(global, sizeof(global_State) == 432);

#define idhashed(t)	((t)->fencedid & FENCED_IDMODE)

static unsigned int objectid (const GCObject *o) {
  const lua_State *th;
  switch (o->gch.tt) {
    case LUA_TTABLE: return o->h.fencedid & FENCED_IDMASK;
    case LUA_TFUNCTION: return o->cl.c.fencedid;
    case LUA_TUSERDATA: return o->u.uv.fencedid;
    case LUA_TTHREAD:  /* the main thread's field is the counter */
      th = &o->th;
      return (th == th->l_G->mainthread) ? 0 : th->fencedid;
    default: return (unsigned int)IntPoint(o);  /* no other kind is a key */
  }
}

/* charge `n` units of the helper rules' work on `t`, if it is id-hashed (ldo.c) */
#define fencedfull(t,n) \
  { if ((n) > 0 && idhashed(t)) luaD_fencedlater((lu_mem)(n)); }

/* charge `steps` steps walked along a chain of `t`, if it is id-hashed (ldo.c) */
#define fencedsteps(t,steps) \
  { if ((steps) > 0 && idhashed(t)) luaD_fencedwalk((lu_mem)(steps)); }


/*
** A fingerprint of what a script's results depend on in this build besides its inputs
** (fenced advertises it beside its apply rules): the sizes of the core structs (the memory
** limit and the collector count bytes), the configuration numbers, and libm's results for
** fixed inputs, formatted as `tostring` formats them. FNV-1a, 64 bits.
*/
static unsigned long long fenced_fnv (unsigned long long h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i;
  for (i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
  return h;
}

LUA_API unsigned long long lua_fenced_layout (void) {
  /* volatile: so the compiler cannot fold libm's results at build time */
  volatile double a = 0.5, b = 1.1, c = 2.5, d = 3.3, e = 10.3, f = 3.1, g = 7.0;
  size_t sizes[] = {
    sizeof(Table), sizeof(CClosure), sizeof(LClosure), sizeof(Udata), sizeof(lua_State),
    sizeof(TString), sizeof(Node), sizeof(Proto), sizeof(UpVal), sizeof(global_State),
    sizeof(CallInfo), sizeof(TValue), sizeof(lua_Number), sizeof(void *), sizeof(size_t),
    LUAI_MAXCCALLS, LUAI_MAXCALLS, LUAI_MAXCSTACK, LUAI_GCPAUSE, LUAI_GCMUL,
    LUA_MINSTACK, LUAI_MAXUPVALUES, LUAI_MAXVARS, LUAL_BUFFERSIZE, LUA_IDSIZE,
    MAXBITS, BASIC_STACK_SIZE, BASIC_CI_SIZE, MINSTRTABSIZE, LUA_FENCED_BYTES
  };
  double r[12];
  char buf[LUAI_MAXNUMBER2STR * 12 + 1];
  size_t used = 0;
  int i;
  unsigned long long h = 14695981039346656037ULL;
  r[0] = sin(a); r[1] = cos(b); r[2] = tan(c); r[3] = exp(b); r[4] = log(g);
  r[5] = pow(c, d); r[6] = fmod(e, f); r[7] = sqrt(g); r[8] = atan2(d, e);
  r[9] = log10(e); r[10] = floor(-d) + ceil(d); r[11] = a * b + c;  /* FMA contracts this */
  for (i = 0; i < 12; i++)
    used += (size_t)lua_number2str(buf + used, r[i]);
  h = fenced_fnv(h, sizes, sizeof(sizes));
  h = fenced_fnv(h, r, sizeof(r));
  h = fenced_fnv(h, buf, used);
  return h;
}


/*
** number of ints inside a lua_Number
*/
#define numints		cast_int(sizeof(lua_Number)/sizeof(int))



#define dummynode		(&dummynode_)

static const Node dummynode_ = {
  {{NULL}, LUA_TNIL},  /* value */
  {{{NULL}, LUA_TNIL, NULL}}  /* key */
};


/*
** hash for lua_Numbers
*/
static Node *hashnum (const Table *t, lua_Number n) {
  unsigned int a[numints];
  int i;
  if (luai_numeq(n, 0))  /* avoid problems with -0 */
    return gnode(t, 0);
  memcpy(a, &n, sizeof(a));
  for (i = 1; i < numints; i++) a[0] += a[i];
  return hashmod(t, a[0]);
}



/*
** returns the `main' position of an element in a table (that is, the index
** of its hash value)
*/
static Node *mainposition (const Table *t, const TValue *key) {
  switch (ttype(key)) {
    case LUA_TNUMBER:
      return hashnum(t, nvalue(key));
    case LUA_TSTRING:
      return hashstr(t, rawtsvalue(key));
    case LUA_TBOOLEAN:
      return hashboolean(t, bvalue(key));
    case LUA_TLIGHTUSERDATA:
      return hashpointer(t, pvalue(key));
    default:
      if (idhashed(t))  /* fenced: by creation id (above) */
        return hashmod(t, objectid(gcvalue(key)));
      return hashpointer(t, gcvalue(key));
  }
}


/*
** returns the index for `key' if `key' is an appropriate key to live in
** the array part of the table, -1 otherwise.
*/
static int arrayindex (const TValue *key) {
  if (ttisnumber(key)) {
    lua_Number n = nvalue(key);
    int k;
    lua_number2int(k, n);
    if (luai_numeq(cast_num(k), n))
      return k;
  }
  return -1;  /* `key' did not match some condition */
}


/*
** returns the index of a `key' for table traversals. First goes all
** elements in the array part, then elements in the hash part. The
** beginning of a traversal is signalled by -1.
*/
static int findindex (lua_State *L, Table *t, StkId key) {
  int i;
  if (ttisnil(key)) return -1;  /* first iteration */
  i = arrayindex(key);
  if (0 < i && i <= t->sizearray)  /* is `key' inside array part? */
    return i-1;  /* yes; that's the index (corrected to C) */
  else {
    Node *n = mainposition(t, key);
    int steps = 0;  /* fenced: steps along the chain (above) */
    do {  /* check whether `key' is somewhere in the chain */
      /* key may be dead already, but it is ok to use it in `next' */
      if (luaO_rawequalObj(key2tval(n), key) ||
            (ttype(gkey(n)) == LUA_TDEADKEY && iscollectable(key) &&
             gcvalue(gkey(n)) == gcvalue(key))) {
        fencedsteps(t, steps);
        i = cast_int(n - gnode(t, 0));  /* key index in hash table */
        /* hash elements are numbered after array ones */
        return i + t->sizearray;
      }
      else { n = gnext(n); steps++; }
    } while (n);
    fencedsteps(t, steps);
    luaG_runerror(L, "invalid key to " LUA_QL("next"));  /* key not found */
    return 0;  /* to avoid warnings */
  }
}


int luaH_next (lua_State *L, Table *t, StkId key) {
  int i = findindex(L, t, key);  /* find original element */
  int from = i;  /* fenced: the slots scanned, empty ones included (helper rules) */
  for (i++; i < t->sizearray; i++) {  /* try first array part */
    if (!ttisnil(&t->array[i])) {  /* a non-nil value? */
      fencedfull(t, (i - from) / FENCED_PER_MOVE);
      setnvalue(key, cast_num(i+1));
      setobj2s(L, key+1, &t->array[i]);
      return 1;
    }
  }
  for (i -= t->sizearray; i < sizenode(t); i++) {  /* then hash part */
    if (!ttisnil(gval(gnode(t, i)))) {  /* a non-nil value? */
      fencedfull(t, (i + t->sizearray - from) / FENCED_PER_MOVE);
      setobj2s(L, key, key2tval(gnode(t, i)));
      setobj2s(L, key+1, gval(gnode(t, i)));
      return 1;
    }
  }
  fencedfull(t, (i + t->sizearray - from) / FENCED_PER_MOVE);
  return 0;  /* no more elements */
}


/*
** {=============================================================
** Rehash
** ==============================================================
*/


static int computesizes (int nums[], int *narray) {
  int i;
  int twotoi;  /* 2^i */
  int a = 0;  /* number of elements smaller than 2^i */
  int na = 0;  /* number of elements to go to array part */
  int n = 0;  /* optimal size for array part */
  for (i = 0, twotoi = 1; twotoi/2 < *narray; i++, twotoi *= 2) {
    if (nums[i] > 0) {
      a += nums[i];
      if (a > twotoi/2) {  /* more than half elements present? */
        n = twotoi;  /* optimal size (till now) */
        na = a;  /* all elements smaller than n will go to array part */
      }
    }
    if (a == *narray) break;  /* all elements already counted */
  }
  *narray = n;
  lua_assert(*narray/2 <= na && na <= *narray);
  return na;
}


static int countint (const TValue *key, int *nums) {
  int k = arrayindex(key);
  if (0 < k && k <= MAXASIZE) {  /* is `key' an appropriate array index? */
    nums[ceillog2(k)]++;  /* count as such */
    return 1;
  }
  else
    return 0;
}


static int numusearray (const Table *t, int *nums) {
  int lg;
  int ttlg;  /* 2^lg */
  int ause = 0;  /* summation of `nums' */
  int i = 1;  /* count to traverse all array keys */
  for (lg=0, ttlg=1; lg<=MAXBITS; lg++, ttlg*=2) {  /* for each slice */
    int lc = 0;  /* counter */
    int lim = ttlg;
    if (lim > t->sizearray) {
      lim = t->sizearray;  /* adjust upper limit */
      if (i > lim)
        break;  /* no more elements to count */
    }
    /* count elements in range (2^(lg-1), 2^lg] */
    for (; i <= lim; i++) {
      if (!ttisnil(&t->array[i-1]))
        lc++;
    }
    nums[lg] += lc;
    ause += lc;
  }
  return ause;
}


static int numusehash (const Table *t, int *nums, int *pnasize) {
  int totaluse = 0;  /* total number of elements */
  int ause = 0;  /* summation of `nums' */
  int i = sizenode(t);
  while (i--) {
    Node *n = &t->node[i];
    if (!ttisnil(gval(n))) {
      ause += countint(key2tval(n), nums);
      totaluse++;
    }
  }
  *pnasize += ause;
  return totaluse;
}


static void setarrayvector (lua_State *L, Table *t, int size) {
  int i;
  luaM_reallocvector(L, t->array, t->sizearray, size, TValue);
  for (i=t->sizearray; i<size; i++)
     setnilvalue(&t->array[i]);
  t->sizearray = size;
}


static void setnodevector (lua_State *L, Table *t, int size) {
  int lsize;
  if (size == 0) {  /* no elements to hash part? */
    t->node = cast(Node *, dummynode);  /* use common `dummynode' */
    lsize = 0;
  }
  else {
    int i;
    lsize = ceillog2(size);
    if (lsize > MAXBITS)
      luaG_runerror(L, "table overflow");
    size = twoto(lsize);
    t->node = luaM_newvector(L, size, Node);
    for (i=0; i<size; i++) {
      Node *n = gnode(t, i);
      gnext(n) = NULL;
      setnilvalue(gkey(n));
      setnilvalue(gval(n));
    }
  }
  t->lsizenode = cast_byte(lsize);
  t->lastfree = gnode(t, size);  /* all positions are free */
}


static void resize (lua_State *L, Table *t, int nasize, int nhsize) {
  int i;
  int oldasize = t->sizearray;
  int oldhsize = t->lsizenode;
  Node *nold = t->node;  /* save old hash ... */
  /* fenced: a slot for every slot counted and rehashed (above) */
  fencedsteps(t, (lu_mem)oldasize + (nold == dummynode ? 0 : (lu_mem)twoto(oldhsize)));
  if (nasize > oldasize)  /* array part must grow? */
    setarrayvector(L, t, nasize);
  /* create new hash part with appropriate size */
  setnodevector(L, t, nhsize);  
  if (nasize < oldasize) {  /* array part must shrink? */
    t->sizearray = nasize;
    /* re-insert elements from vanishing slice */
    for (i=nasize; i<oldasize; i++) {
      if (!ttisnil(&t->array[i]))
        setobjt2t(L, luaH_setnum(L, t, i+1), &t->array[i]);
    }
    /* shrink array */
    luaM_reallocvector(L, t->array, oldasize, nasize, TValue);
  }
  /* re-insert elements from hash part */
  for (i = twoto(oldhsize) - 1; i >= 0; i--) {
    Node *old = nold+i;
    if (!ttisnil(gval(old)))
      setobjt2t(L, luaH_set(L, t, key2tval(old)), gval(old));
  }
  if (nold != dummynode)
    luaM_freearray(L, nold, twoto(oldhsize), Node);  /* free old array */
}


void luaH_resizearray (lua_State *L, Table *t, int nasize) {
  int nsize = (t->node == dummynode) ? 0 : sizenode(t);
  resize(L, t, nasize, nsize);
}


static void rehash (lua_State *L, Table *t, const TValue *ek) {
  int nasize, na;
  int nums[MAXBITS+1];  /* nums[i] = number of keys between 2^(i-1) and 2^i */
  int i;
  int totaluse;
  for (i=0; i<=MAXBITS; i++) nums[i] = 0;  /* reset counts */
  nasize = numusearray(t, nums);  /* count keys in array part */
  totaluse = nasize;  /* all those keys are integer keys */
  totaluse += numusehash(t, nums, &nasize);  /* count keys in hash part */
  /* count extra key */
  nasize += countint(ek, nums);
  totaluse++;
  /* compute new size for array part */
  na = computesizes(nums, &nasize);
  /* resize the table to new computed sizes */
  resize(L, t, nasize, totaluse - na);
}



/*
** }=============================================================
*/


Table *luaH_new (lua_State *L, int narray, int nhash) {
  Table *t;
  /* fenced: a new table and the parts its constructor asks for (ldo.c); its later
     resizes are not charged: when a table holding object keys fills up depends on where
     those keys hash, i.e. on memory addresses, and so would the charge */
  luaD_fenceddebt(L, 4 + ((lu_mem)narray + (lu_mem)nhash) / 4);
  t = luaM_new(L, Table);
  luaC_link(L, obj2gco(t), LUA_TTABLE);
  /* fenced: its id, and whether it hashes object keys by id (above) */
  t->fencedid = luaE_fencedid(L) | (luaD_fencedidson() ? FENCED_IDMODE : 0);
  t->metatable = NULL;
  t->flags = cast_byte(~0);
  /* temporary values (kept only if some malloc fails) */
  t->array = NULL;
  t->sizearray = 0;
  t->lsizenode = 0;
  t->node = cast(Node *, dummynode);
  setarrayvector(L, t, narray);
  setnodevector(L, t, nhash);
  return t;
}


void luaH_free (lua_State *L, Table *t) {
  if (t->node != dummynode)
    luaM_freearray(L, t->node, sizenode(t), Node);
  luaM_freearray(L, t->array, t->sizearray, TValue);
  luaM_free(L, t);
}


static Node *getfreepos (Table *t) {
  while (t->lastfree-- > t->node) {
    if (ttisnil(gkey(t->lastfree)))
      return t->lastfree;
  }
  return NULL;  /* could not find a free place */
}



/*
** inserts a new key into a hash table; first, check whether key's main 
** position is free. If not, check whether colliding node is in its main 
** position or not: if it is not, move colliding node to an empty place and 
** put new key in its main position; otherwise (colliding node is in its main 
** position), new key goes to an empty position. 
*/
static TValue *newkey (lua_State *L, Table *t, const TValue *key) {
  Node *mp = mainposition(t, key);
  if (!ttisnil(gval(mp)) || mp == dummynode) {
    Node *othern;
    Node *n = getfreepos(t);  /* get a free place */
    if (n == NULL) {  /* cannot find a free place? */
      rehash(L, t, key);  /* grow table */
      return luaH_set(L, t, key);  /* re-insert key into grown table */
    }
    lua_assert(n != dummynode);
    othern = mainposition(t, key2tval(mp));
    if (othern != mp) {  /* is colliding node out of its main position? */
      /* yes; move colliding node into free position */
      int steps = 0;  /* fenced: steps along the chain (above) */
      while (gnext(othern) != mp) {  /* find previous */
        othern = gnext(othern);
        steps++;
      }
      fencedsteps(t, steps);
      gnext(othern) = n;  /* redo the chain with `n' in place of `mp' */
      *n = *mp;  /* copy colliding node into free pos. (mp->next also goes) */
      gnext(mp) = NULL;  /* now `mp' is free */
      setnilvalue(gval(mp));
    }
    else {  /* colliding node is in its own main position */
      /* new node will go into free position */
      gnext(n) = gnext(mp);  /* chain new position */
      gnext(mp) = n;
      mp = n;
    }
  }
  gkey(mp)->value = key->value; gkey(mp)->tt = key->tt;
  luaC_barriert(L, t, key);
  lua_assert(ttisnil(gval(mp)));
  return gval(mp);
}


/*
** search function for integers
*/
const TValue *luaH_getnum (Table *t, int key) {
  /* (1 <= key && key <= t->sizearray) */
  if (cast(unsigned int, key-1) < cast(unsigned int, t->sizearray))
    return &t->array[key-1];
  else {
    lua_Number nk = cast_num(key);
    Node *n = hashnum(t, nk);
    int steps = 0;  /* fenced: steps along the chain (above) */
    do {  /* check whether `key' is somewhere in the chain */
      if (ttisnumber(gkey(n)) && luai_numeq(nvalue(gkey(n)), nk)) {
        fencedsteps(t, steps);
        return gval(n);  /* that's it */
      }
      else { n = gnext(n); steps++; }
    } while (n);
    fencedsteps(t, steps - 1);
    return luaO_nilobject;
  }
}


/*
** search function for strings
*/
const TValue *luaH_getstr (Table *t, TString *key) {
  Node *n = hashstr(t, key);
  int steps = 0;  /* fenced: steps along the chain (above) */
  do {  /* check whether `key' is somewhere in the chain */
    if (ttisstring(gkey(n)) && rawtsvalue(gkey(n)) == key) {
      fencedsteps(t, steps);
      return gval(n);  /* that's it */
    }
    else { n = gnext(n); steps++; }
  } while (n);
  fencedsteps(t, steps - 1);
  return luaO_nilobject;
}


/*
** main search function
*/
const TValue *luaH_get (Table *t, const TValue *key) {
  switch (ttype(key)) {
    case LUA_TNIL: return luaO_nilobject;
    case LUA_TSTRING: return luaH_getstr(t, rawtsvalue(key));
    case LUA_TNUMBER: {
      int k;
      lua_Number n = nvalue(key);
      lua_number2int(k, n);
      if (luai_numeq(cast_num(k), nvalue(key))) /* index is int? */
        return luaH_getnum(t, k);  /* use specialized version */
      /* else go through */
    }
    default: {
      Node *n = mainposition(t, key);
      int steps = 0;  /* fenced: steps along the chain (above) */
      do {  /* check whether `key' is somewhere in the chain */
        if (luaO_rawequalObj(key2tval(n), key)) {
          fencedsteps(t, steps);
          return gval(n);  /* that's it */
        }
        else { n = gnext(n); steps++; }
      } while (n);
      fencedsteps(t, steps - 1);
      return luaO_nilobject;
    }
  }
}


TValue *luaH_set (lua_State *L, Table *t, const TValue *key) {
  const TValue *p = luaH_get(t, key);
  t->flags = 0;
  if (p != luaO_nilobject)
    return cast(TValue *, p);
  else {
    if (ttisnil(key)) luaG_runerror(L, "table index is nil");
    else if (ttisnumber(key) && luai_numisnan(nvalue(key)))
      luaG_runerror(L, "table index is NaN");
    return newkey(L, t, key);
  }
}


TValue *luaH_setnum (lua_State *L, Table *t, int key) {
  const TValue *p = luaH_getnum(t, key);
  if (p != luaO_nilobject)
    return cast(TValue *, p);
  else {
    TValue k;
    setnvalue(&k, cast_num(key));
    return newkey(L, t, &k);
  }
}


TValue *luaH_setstr (lua_State *L, Table *t, TString *key) {
  const TValue *p = luaH_getstr(t, key);
  if (p != luaO_nilobject)
    return cast(TValue *, p);
  else {
    TValue k;
    setsvalue(L, &k, key);
    return newkey(L, t, &k);
  }
}


static int unbound_search (Table *t, unsigned int j) {
  unsigned int i = j;  /* i is zero or a present index */
  lu_mem looked = 1;  /* fenced: lookups made (helper rules, ldo.c) */
  j++;
  /* find `i' and `j' such that i is present and j is not */
  while (!ttisnil(luaH_getnum(t, j))) {
    i = j;
    j *= 2;
    looked++;
    if (j > cast(unsigned int, MAX_INT)) {  /* overflow? */
      /* table was built with bad purposes: resort to linear search */
      i = 1;
      while (!ttisnil(luaH_getnum(t, i))) i++;
      fencedfull(t, looked + i);
      return i - 1;
    }
  }
  /* now do a binary search between them */
  while (j - i > 1) {
    unsigned int m = (i+j)/2;
    if (ttisnil(luaH_getnum(t, m))) j = m;
    else i = m;
    looked++;
  }
  fencedfull(t, looked);
  return i;
}


/*
** Try to find a boundary in table `t'. A `boundary' is an integer index
** such that t[i] is non-nil and t[i+1] is nil (and 0 if t[1] is nil).
*/
int luaH_getn (Table *t) {
  unsigned int j = t->sizearray;
  if (j > 0 && ttisnil(&t->array[j - 1])) {
    /* there is a boundary in the array part: (binary) search for it */
    unsigned int i = 0;
    while (j - i > 1) {
      unsigned int m = (i+j)/2;
      if (ttisnil(&t->array[m - 1])) j = m;
      else i = m;
    }
    return i;
  }
  /* else must find a boundary in hash part */
  else if (t->node == dummynode)  /* hash part is empty? */
    return j;  /* that is easy... */
  else return unbound_search(t, j);
}



#if defined(LUA_DEBUG)

Node *luaH_mainposition (const Table *t, const TValue *key) {
  return mainposition(t, key);
}

int luaH_isdummy (Node *n) { return n == dummynode; }

#endif
