/* govern's event log: idempotent append by event id (docs/protocols.md maps each step to
   govern/runtime/_eventlog.py).

   Appenders send events by id; two of them send the same id (a producer retried from another process),
   and any commit may be ambiguous (it committed but the acknowledgement was lost, so the appender sends
   the same event again) or fail before it commits (rolled back). The append transaction holds the log's
   lock, looks the id up, and either answers the existing position or writes the event at the next
   position.

   Safety: every id is in the log at most once, positions are dense, and an appender that got an answer
   (position p) for its id finds its id at p.
   Seeded bug (spin -DBUG_LOOKUP_OUTSIDE): the id is looked up before the lock is taken. */

#define SLOTS 4
#define NONE 0

byte log[SLOTS];          /* the id at each position */
byte length = 0;
bool locked = false;

proctype Appender(byte id) {
  byte pos, sends = 0, found_at;
  bool known;
send:
  sends++;
#ifdef BUG_LOOKUP_OUTSIDE
  atomic {                                   /* look the id up without the lock */
    known = false; found_at = 0;
    do
    :: found_at < length && log[found_at] == id -> known = true; break
    :: found_at < length && log[found_at] != id -> found_at++
    :: found_at >= length -> break
    od
  };
  atomic { !locked -> locked = true };
#else
  atomic { !locked -> locked = true };       /* BEGIN IMMEDIATE / FOR UPDATE on the log's counter */
  atomic {
    known = false; found_at = 0;
    do
    :: found_at < length && log[found_at] == id -> known = true; break
    :: found_at < length && log[found_at] != id -> found_at++
    :: found_at >= length -> break
    od
  };
#endif
  atomic {
    if
    :: known -> pos = found_at               /* idempotent: the existing position */
    :: !known && length < SLOTS -> pos = length; log[length] = id; length++
    :: else -> pos = SLOTS                   /* out of room (the model's bound) */
    fi
  };
  if
  :: atomic { locked = false; known = false; found_at = 0 }   /* COMMIT, acknowledged */
  :: atomic {                                 /* COMMIT, acknowledgement lost: send it again */
       locked = false; known = false; found_at = 0; pos = 0
     };
     if :: sends < 2 -> goto send :: else -> goto done fi
  fi;
  assert(pos == SLOTS || log[pos] == id);
done:
  skip
}

active proctype Invariants() {
  byte i, j;
  do
  :: atomic {
       i = 0;
       do
       :: i < length ->
            j = i + 1;
            do
            :: j < length -> assert(log[i] != log[j]); j++
            :: else -> break
            od;
            assert(log[i] != NONE);
            i++
       :: else -> break
       od;
       i = 0; j = 0
     }
  od
}

init {
  atomic { run Appender(1); run Appender(1); run Appender(2) }
}
