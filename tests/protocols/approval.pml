/* The approval gate of bide: k-of-n signed decisions, numbered turns, and a final tally
   (docs/protocols.md maps each step to the code in bide/approvals/).

   Approvers journal decisions on a waiting call; the gate counts them and journals its tally before the
   tool runs. Each decision, and the tally, is written together with the call's next turn record
   (turn n = the number of decision records its writer read, plus one) in one all-or-nothing write, so
   whoever takes turn n first wins and the loser reads the journal again.

   Safety: the tally counts exactly the decisions journaled before it, and no decision is journaled
   after the tally (so a tally can never be contradicted by a decision it did not read); the tool runs
   only on a tally that reaches NEED.
   Seeded bug (spin -DBUG_NO_TURN): decisions are written without taking a turn. */

#define APPROVERS 3
#define NEED 2
#define TURNS (APPROVERS + 2)

bool turn[TURNS];         /* approval:turn:<call>:<n> */
byte decisions = 0;       /* approval:decision:* records in the journal */
byte approvals = 0;       /* how many of them approve */
bool tally = false;       /* approval:tally:<call> */
byte tally_decisions = 0; /* the decision records the tally names */
byte tally_approvals = 0;
bool tool_ran = false;

proctype Approver(bool approve) {
  byte n, tries = 0;
retry:
  atomic {                                 /* read the journal: is the gate still open? */
    if
    :: tally -> goto done
    :: else -> n = decisions + 1
    fi
  };
  atomic {                                 /* the decision and its turn, all or nothing */
#ifdef BUG_NO_TURN
    assert(!tally);
    decisions++; if :: approve -> approvals++ :: else -> skip fi; n = 0; goto done
#else
    if
    :: !turn[n] ->
         turn[n] = true; assert(!tally);
         decisions++; if :: approve -> approvals++ :: else -> skip fi; n = 0; goto done
    :: else -> n = 0                       /* lost the turn: read again */
    fi
#endif
  };
  if
  :: tries < APPROVERS -> tries++; goto retry
  :: else -> skip
  fi;
done:
  skip
}

proctype Gate() {
  byte n, seen, yes, tries = 0;
consult:
  atomic { n = decisions + 1; seen = decisions; yes = approvals };   /* read and count */
  if
  :: yes >= NEED || seen - yes > APPROVERS - NEED -> skip         /* decided: approved or denied */
  :: else ->                                                      /* pending: consult again later */
       n = 0; seen = 0; yes = 0;
       if :: tries < 2 * APPROVERS -> tries++; goto consult :: else -> goto done fi
  fi;
  atomic {                                 /* the tally and its turn, all or nothing */
    if
    :: !turn[n] ->
         turn[n] = true; tally = true; tally_decisions = seen; tally_approvals = yes;
         assert(tally_decisions == decisions && tally_approvals == approvals)
    :: else -> n = 0; seen = 0; yes = 0    /* a decision took the turn first: recount */
    fi
  };
  if
  :: tally -> skip
  :: else -> if :: tries < 2 * APPROVERS -> tries++; goto consult :: else -> goto done fi
  fi;
  if
  :: tally_approvals >= NEED -> tool_ran = true
  :: else -> skip                          /* denied: the model is told, the tool never runs */
  fi;
done:
  skip
}

init {
  atomic { run Approver(true); run Approver(false); run Approver(true); run Gate() }
}

/* Checked at every state: a decision never lands after the tally, and the tally matches the journal. */
active proctype Invariants() {
  do
  :: atomic { tally && (decisions != tally_decisions || approvals != tally_approvals) -> assert(false) }
  :: atomic { tool_ran && tally_approvals < NEED -> assert(false) }
  od
}
