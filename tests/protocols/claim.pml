/* The side-effect claim protocol of bide (docs/protocols.md maps each step to the code).

   One side-effect call of one run. Drivers (each may crash and come back as a new incarnation) take the
   run's lease, load the journal, and either use the recorded result, claim the next attempt (an attempt
   marker with a window: its deadline), or find a live attempt without a result and ask the reconciler
   once the window has closed. A person may resolve a halted call once its window has closed, under the
   run's lease (which a live driver holds: then the person is refused). Time is abstract: any open window may close and any lease may expire at any
   moment (a paused process), which over-approximates every real schedule.

   Assumptions (docs/guarantee.md): the store picks one winner per key; clocks are within the skew margin
   (a window closed for the decider is closed for the driver); the system of record shows an effect before
   the window it started in is closed for deciders (its lag is within the skew margin).

   Safety: the tool fires at most once (fired <= 1), and nothing is appended after run:end.
   Seeded bugs (spin -DBUG_x): NO_WINDOW starts the tool without checking its window; EARLY_DECIDE lets
   the reconciler and the person decide while the window is open; NO_SEAL_NO_FENCE drops the store's
   refusal of writes after run:end and of writes under a lost lease, and drives from a stale snapshot. */

#define GENS 3           /* attempt generations 0..GENS-1 */
#define DRIVERS 2
#define LIVES 1          /* a crash ends a driver for good; a pause is a lease that expires */
#define NONE 0
#define NOTSTARTED 1
#define MINE 1           /* marker owners: 0 = absent, 100 = resolver, else a holder id */
#define RESOLVER 100

byte marker[GENS];       /* attempt:<gen>: who claimed it */
bool voided[GENS];       /* not-started:<gen> */
bool window_open[GENS];  /* the attempt's window (attempt time .. deadline) is still open */
byte fired_in[GENS];     /* real-world effects started by attempt <gen> */
bool result = false;     /* result:<call> */
bool ended = false;      /* run:end */
byte fired = 0;

byte lease_holder = 0;   /* 0: never granted or released */
byte lease_token = 0;
bool lease_live = false;
byte next_holder = 1;

/* A journal write by `me` under token `tok`: refused once the run ended (S8) or when the lease was
   taken over (S10); `ok` says whether it happened. */
inline fenced(me, tok, ok) {
#ifdef BUG_NO_SEAL_NO_FENCE
  ok = true
#else
  ok = (!ended && lease_holder == me && lease_token == tok)
#endif
}

inline live_gen(g, found) {   /* the newest claimed generation, and whether it is live (not voided) */
  g = 0; found = false;
  do
  :: g < GENS - 1 && marker[g + 1] != 0 -> g++
  :: else -> break
  od;
  found = (marker[g] != 0 && !voided[g])
}

proctype Driver() {
  byte me, tok, g, lives = LIVES, tries;
  bool ok, found;   /* scratch: reset once read, so that they do not multiply the states */
incarnation:
  if
  :: lives == 0 -> goto done
  :: else -> lives--
  fi;
  atomic { me = next_holder; next_holder++ };
  tries = 0;
acquire:
  atomic {
    if
    :: lease_holder == me && lease_token == tok -> lease_live = true; ok = true   /* renewed */
    :: lease_holder != me && (lease_holder == 0 || !lease_live) ->
         lease_holder = me; lease_token++; tok = lease_token; lease_live = true; ok = true
    :: else -> ok = false
    fi
  };
  if
  :: !ok && tries < 2 -> tries++; goto acquire   /* in flight elsewhere: wait for the lease */
  :: !ok -> goto done                            /* gives up with a RunInFlight status */
  :: else -> ok = false
  fi;
load:                                             /* read the journal, then decide from it */
  atomic {
    live_gen(g, found);
    if
    :: ended || result -> found = false; goto finish
    :: found -> found = false; goto decide        /* a live attempt without a result */
    :: !found && marker[g] != 0 && g == GENS - 1 -> goto done   /* out of generations (bound) */
    :: !found && marker[g] != 0 && g < GENS - 1 -> g++  /* the newest attempt was voided: claim the next */
    :: !found && marker[g] == 0 -> skip           /* nothing claimed yet: gen 0 */
    fi
  };
  atomic {                                        /* write the attempt marker, window open */
    fenced(me, tok, ok);
    if
    :: ok && marker[g] == 0 -> assert(!ended); marker[g] = me; window_open[g] = true
    :: else -> ok = false
    fi
  };
  if
#ifdef BUG_NO_SEAL_NO_FENCE
  :: !ok -> if :: g < GENS - 1 -> g++; goto claim_stale :: else -> goto done fi
#else
  :: !ok -> goto reacquire                        /* lost a race or the lease: reload first */
#endif
  :: else -> skip
  fi;
call:
  if :: goto crash :: skip fi;                    /* killed between the marker and the call */
  atomic {                                        /* the tool starts only inside its window */
#ifdef BUG_NO_WINDOW
    found = true;
#else
    found = window_open[g];
#endif
    if
    :: found -> fired++; fired_in[g]++; assert(fired <= 1)
    :: else -> skip
    fi
  };
  if :: found -> found = false; goto ran :: else -> goto not_started fi;
ran:
  if :: goto crash :: skip fi;                    /* killed after the effect, before its result */
  atomic { fenced(me, tok, ok); if :: ok -> result = true :: else -> skip fi };
  goto written;
not_started:                                      /* the window closed first: provably not started */
  atomic { fenced(me, tok, ok); if :: ok -> voided[g] = true :: else -> skip fi };
written:
  if
  :: ok -> ok = false; goto load
  :: else -> goto reacquire
  fi;
decide:                                           /* a live attempt without a result: reconcile it */
  atomic {
#ifdef BUG_EARLY_DECIDE
    ok = true
#else
    ok = !window_open[g]                          /* wait past its deadline plus the skew margin */
#endif
  };
  if
  :: !ok -> goto done                             /* halts for now (HaltInFlight); no decision */
  :: else -> skip
  fi;
  atomic {                                        /* the reconciler asks the system of record */
    fenced(me, tok, ok);
    if
    :: ok && (fired_in[g] > 0 && !window_open[g]) -> result = true
    :: ok && !(fired_in[g] > 0 && !window_open[g]) && g < GENS - 1 && marker[g + 1] == 0 ->
         marker[g + 1] = RESOLVER; voided[g + 1] = true   /* resolved as not started */
    :: else -> ok = false
    fi
  };
  if
  :: ok -> ok = false; goto load
  :: else -> goto reacquire
  fi;
#ifdef BUG_NO_SEAL_NO_FENCE
claim_stale:                                      /* keeps claiming from its old snapshot */
  atomic { if :: marker[g] == 0 -> assert(!ended); marker[g] = me; window_open[g] = true; ok = true :: else -> ok = false fi };
  if :: ok -> goto call :: else -> goto done fi;
#endif
reacquire:
  ok = false;
  if
  :: tries < 2 -> tries++; goto acquire
  :: else -> goto done
  fi;
finish:
  atomic {
    if
    :: !ended && lease_holder == me && lease_token == tok -> ended = true
    :: else -> skip
    fi;
    if :: lease_holder == me -> lease_holder = 0; lease_live = false :: else -> skip fi
  };
  goto done;
crash:
  ok = false; found = false; tok = 0; g = 0;
  goto incarnation;
done:
  skip
}

/* A person with `bide resolve`: takes the run's lease like a driver (refused while a live driver holds
   it), decides a halted call once its window has closed, writes under that lease and frees it. Taking
   the lease, deciding and writing are one step here: a resolver's lease cannot expire under it, since
   its writes are fenced like a driver's (modelled there). */
proctype Person() {
  byte g;
  bool found, closed;
  atomic {
    if
    :: lease_holder == 0 || !lease_live ->
         live_gen(g, found);
#ifdef BUG_EARLY_DECIDE
         closed = true;
#else
         closed = !window_open[g];        /* HaltInFlight until the deadline plus the skew margin */
#endif
         if
         :: found && closed && !result && !ended && g < GENS - 1 && marker[g + 1] == 0 ->
              lease_token++;              /* a new holder: any earlier driver's writes are fenced off */
              lease_holder = 0; lease_live = false;
              if
              :: (fired_in[g] > 0 && !window_open[g]) -> result = true
              :: !(fired_in[g] > 0 && !window_open[g]) -> marker[g + 1] = RESOLVER; voided[g + 1] = true
              fi
         :: else -> skip
         fi
    :: else -> skip                       /* refused: a live driver holds the lease */
    fi;
    g = 0; found = false; closed = false
  }
}

/* Time: a lease expires (its holder paused or died), the oldest open window closes (its deadline plus
   the skew margin passed). */
proctype Clock() {
  byte g;
  do
  :: atomic { lease_live -> lease_live = false }
  :: atomic {
       g = 0;
       do
       :: g < GENS - 1 && !window_open[g] -> g++
       :: else -> break
       od;
       window_open[g] -> window_open[g] = false; g = 0
     }
  :: timeout -> break
  od
}

init {
  atomic {
    run Driver(); run Driver(); run Person(); run Clock()
  }
}
