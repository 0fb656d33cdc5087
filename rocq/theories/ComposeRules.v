(** * A checked rules machine is the product of its projections.

    Compose.v proves two things that this file joins.  Its part 1 ([check_decomposition_sound])
    says what the extracted decomposition check establishes about single rules: a rule of a
    component reads and writes only that component's variables.  Its part 2 is a product
    construction over two abstract machines A and B ([compose_wfc], [compose_nf_path],
    [compose_cc1], [compose_cc2], ...).  Here: when [check_decomposition] answers [true], the
    rules machine itself — variables, invariants with repairs, guarded events, repaired by its
    own loop ("the first violated invariant, in declaration order") — *is* that product, for the
    projections onto one component [c] (side A) and onto all the other components (side B).

    Section 6, at every valuation (exact equations, no hypothesis but the check):
    - [rules_valid_split]: a state is valid exactly when both projections are;
    - [rules_repair_split]: one repair step of the whole machine is one repair step of the
      product, the product's free choice of which half to repair being made by the whole
      machine's first violated invariant;
    - [rules_apply_split]: whole event [k] is the product's event [to_pe k] (its index among its
      own side's events) and acts on its own half only;
    given normal forms and potentials of the two sides (Compose.v's hypotheses):
    - [rules_step_split], [rules_nf_split], [rules_nf_path], [rules_nf_iff]: a normalized step
      of the whole is the product's normalized step, and the whole machine's own repair loop
      ends, from every state, at the pair of the components' normal forms (and only there);
    - [rules_wfc], [rules_cc1], [rules_cc2]: WFC (potential: the sum of the components'), CC1
      (pairs inside a component as it declares them, every pair across components) and CC2;
    - [rules_unique_normal_forms], [rules_stream_convergence]: the whole machine converges.

    Section 7, the same with the components' facts assumed on their domains only (what a verdict
    gives: every variable in its range), the whole machine on the states whose projections lie
    in those domains: [rules_dom_*], and [rules_commute_iff_A]/[_B], [rules_idem_iff_A]/[_B]: a
    pair inside a component commutes (an event is idempotent) on the whole machine's valid
    states exactly when it does on the component's, so the obligations and idempotence
    verdicts are the components' own.

    Section 8, many components: [check_decomposition_rest] (the rest passes the check again),
    [rules_split_governed] and, by induction over the list of components,
    [rules_components_governed]: a checked machine whose every component is governed on its
    domain (WFC, normal form, CC1, CC2) is governed on the nested domain; [governed_terminating]
    and [governed_unique_normal_forms]: a governed machine converges.

    States here are valuations: a list of integers, entry i the value of variable i (exact
    integers, as in Rules.v's [eval]).  Assignments are simultaneous, first binding of a
    variable wins, as in Compose.v's [assign_fn].  The projection onto a side keeps that side's
    entries and zeroes the others, so each projected machine is the component's rules over the
    whole machine's variable numbering (the other variables sit at zero and are never read or
    written by its rules).

    Section 9 ties valuations to the state ids of tables and of Rules.v's checker: ids and
    in-range valuations correspond one to one, and when [check_rules] answers "match" every
    table entry is the rules machine's step on the valuation its id stands for
    ([check_rules_valuations]).  Renumbering a component's variables from 0 (the component
    machines the engine builds) and carrying a component's table verdict through that
    correspondence to the hypotheses of sections 7 and 8: ComposeTransport.v. *)

From Coq Require Import List Arith Bool Lia ZArith Permutation.
From Govern Require Import Vec ZVec TableCheck Rules Newman Governance Compose.
Import ListNotations.

(** ** 1. The rules machine over valuations *)

Definition val : Type := list Z.
Notation rule := (expr * assignment)%type.

Definition get (x : val) (i : nat) : Z := nth i x 0%Z.

(** All assignments of [asg] at once, each evaluated on [x]. *)
Definition upd (x : val) (asg : assignment) : val :=
  map (fun i => assign_fn (get x) asg i) (seq 0 (length x)).

Definition holds (x : val) (e : expr) : bool := nz (eval (get x) e).

(** Valid: every invariant holds. *)
Definition rvalid (invs : list rule) (x : val) : bool := forallb (fun r => holds x (fst r)) invs.

(** One repair step: the repair of the first violated invariant (the state itself when valid). *)
Fixpoint rrepair (invs : list rule) (x : val) : val :=
  match invs with
  | [] => x
  | r :: t => if holds x (fst r) then rrepair t x else upd x (snd r)
  end.

(** An event: its effect where its guard holds, else nothing. *)
Definition rapply (r : rule) (x : val) : val := if holds x (fst r) then upd x (snd r) else x.

Definition noev : rule := (ELit 0, []).

(** Event [k] of the list (no event, no change). *)
Definition revent (evs : list rule) (k : nat) (x : val) : val := rapply (nth k evs noev) x.

Lemma length_upd x asg : length (upd x asg) = length x.
Proof. unfold upd. rewrite map_length, seq_length. reflexivity. Qed.

Lemma get_upd x asg i : i < length x -> get (upd x asg) i = assign_fn (get x) asg i.
Proof.
  intros H. unfold get at 1, upd. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto).
  rewrite seq_nth by auto. reflexivity.
Qed.

Lemma get_out x i : length x <= i -> get x i = 0%Z.
Proof. intros H. unfold get. apply nth_overflow. auto. Qed.

Lemma length_rrepair invs x : length (rrepair invs x) = length x.
Proof. induction invs as [|r t IH]; simpl; auto. destruct (holds x (fst r)); auto. apply length_upd. Qed.

Lemma length_revent evs k x : length (revent evs k x) = length x.
Proof. unfold revent, rapply. destruct (holds x _); auto. apply length_upd. Qed.

Lemma rrepair_valid invs x : rvalid invs x = true -> rrepair invs x = x.
Proof.
  induction invs as [|r t IH]; simpl; auto. intros H. apply andb_prop in H as [H1 H2]. rewrite H1. auto.
Qed.

(** Lists of the same length are equal when they agree at every index. *)
Lemma val_ext x y : length x = length y -> (forall i, i < length x -> get x i = get y i) -> x = y.
Proof. intros Hl H. apply nth_ext with 0%Z 0%Z; auto. Qed.

(** ** 2. The components of a checked decomposition *)

(** The rules whose label [keep] accepts, and their labels. *)
Fixpoint keep_rules (keep : nat -> bool) (rs : list rule) (ls : list nat) : list rule :=
  match rs, ls with
  | r :: rt, l :: lt => if keep l then r :: keep_rules keep rt lt else keep_rules keep rt lt
  | _, _ => []
  end.

Fixpoint keep_labels (keep : nat -> bool) (rs : list rule) (ls : list nat) : list nat :=
  match rs, ls with
  | r :: rt, l :: lt => if keep l then l :: keep_labels keep rt lt else keep_labels keep rt lt
  | _, _ => []
  end.

Lemma rules_in_true lab rs cs acc : rules_in lab rs cs acc = andb acc (rules_in lab rs cs true).
Proof.
  revert cs acc. induction rs as [|r rt IH]; intros [|c ct] acc; simpl; try (destruct acc; reflexivity).
  rewrite (IH ct (andb acc (rule_in lab c r))), (IH ct (rule_in lab c r)). destruct acc; reflexivity.
Qed.

Lemma rules_in_cons lab r rt l lt : rules_in lab (r :: rt) (l :: lt) true = true ->
  rule_in lab l r = true /\ rules_in lab rt lt true = true.
Proof.
  simpl. rewrite rules_in_true. intros H. apply andb_prop in H as [H1 H2]. auto.
Qed.

Lemma rules_in_keep lab keep rs ls : rules_in lab rs ls true = true ->
  rules_in lab (keep_rules keep rs ls) (keep_labels keep rs ls) true = true.
Proof.
  revert ls. induction rs as [|r rt IH]; intros [|l lt] H; simpl in *; auto; try discriminate.
  apply (rules_in_cons lab r rt l lt) in H as [H1 H2].
  destruct (keep l); simpl; auto. rewrite rules_in_true, H1. simpl. auto.
Qed.

(** The machine without some components passes the check again: components are split off one at
    a time. *)
Theorem check_decomposition_rest lab invs inv_lab evs ev_lab keep :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  check_decomposition lab (keep_rules keep invs inv_lab) (keep_labels keep invs inv_lab)
                          (keep_rules keep evs ev_lab) (keep_labels keep evs ev_lab) = true.
Proof.
  unfold check_decomposition. intros H. apply andb_prop in H as [H1 H2].
  rewrite !rules_in_keep; auto.
Qed.

(** ** 3. Rules confined to a set of variables *)

(** A rule confined to the variables [Q] accepts: its condition reads only them, its assignment
    writes only them and what it writes there depends only on them. *)
Definition agree (Q : nat -> bool) (x y : nat -> Z) : Prop := forall i, Q i = true -> x i = y i.

Definition confined (Q : nat -> bool) (r : rule) : Prop :=
  (forall x y, agree Q x y -> eval x (fst r) = eval y (fst r)) /\
  (forall x i, Q i = false -> assign_fn x (snd r) i = x i) /\
  (forall x y i, agree Q x y -> Q i = true -> assign_fn x (snd r) i = assign_fn y (snd r) i).

Lemma rule_in_confined lab c r : rule_in lab c r = true -> confined (in_comp lab c) r.
Proof.
  unfold rule_in. intros H. apply andb_prop in H as [He Ha]. split; [|split].
  - intros x y Hxy. apply expr_in_local with lab c; auto.
  - intros x i Hi. apply assign_frame with lab c; auto.
  - intros x y i Hxy Hi. apply assign_local with lab c; auto.
Qed.

(** A rule of another component is confined to the complement of [c]'s variables. *)
Lemma rule_in_confined_other lab c d r : rule_in lab d r = true -> d <> c ->
  confined (fun i => negb (in_comp lab c i)) r.
Proof.
  intros H Hdc. destruct (rule_in_confined lab d r H) as (H1 & H2 & H3).
  assert (Sub : forall i, in_comp lab d i = true -> negb (in_comp lab c i) = true).
  { intros i Hi. destruct (in_comp lab c i) eqn:E; auto. exfalso. apply Hdc.
    apply (in_comp_unique lab d c i); auto. }
  assert (Ag : forall x y, agree (fun i => negb (in_comp lab c i)) x y -> agree (in_comp lab d) x y).
  { intros x y Hxy i Hi. apply Hxy, Sub, Hi. }
  split; [|split].
  - intros x y Hxy. apply H1, Ag, Hxy.
  - intros x i Hi. apply H2. destruct (in_comp lab d i) eqn:E; auto.
    apply Sub in E. rewrite E in Hi. discriminate.
  - intros x y i Hxy Hi. destruct (in_comp lab d i) eqn:E.
    + apply H3; auto.
    + rewrite !H2 by auto. apply Hxy, Hi.
Qed.

(** [keep Q x]: the projection of [x] on the variables [Q] accepts (the others read 0). *)
Definition keep (Q : nat -> bool) (x : val) : val :=
  map (fun i => if Q i then get x i else 0%Z) (seq 0 (length x)).

Definition zero_off (Q : nat -> bool) (x : val) : Prop := forall i, Q i = false -> get x i = 0%Z.

Lemma length_keep Q x : length (keep Q x) = length x.
Proof. unfold keep. rewrite map_length, seq_length. reflexivity. Qed.

Lemma get_keep Q x i : get (keep Q x) i = if Q i then get x i else 0%Z.
Proof.
  destruct (Nat.lt_ge_cases i (length x)) as [H|H].
  - unfold get at 1, keep. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto).
    rewrite seq_nth by auto. reflexivity.
  - rewrite get_out by (rewrite length_keep; auto). rewrite get_out by auto. destruct (Q i); auto.
Qed.

Lemma keep_agree Q x : agree Q (get (keep Q x)) (get x).
Proof. intros i Hi. rewrite get_keep, Hi. reflexivity. Qed.

Lemma keep_zero Q x : zero_off Q (keep Q x).
Proof. intros i Hi. rewrite get_keep, Hi. reflexivity. Qed.

Lemma holds_keep Q r x : confined Q r -> holds (keep Q x) (fst r) = holds x (fst r).
Proof. intros (H & _ & _). unfold holds. rewrite (H _ _ (keep_agree Q x)). reflexivity. Qed.

(** An assignment confined to [Q]: projecting on [Q] after it is applying it to the projection. *)
Lemma keep_upd_in Q r x : confined Q r -> keep Q (upd x (snd r)) = upd (keep Q x) (snd r).
Proof.
  intros (_ & H2 & H3). apply val_ext; [rewrite length_keep, !length_upd, length_keep; auto|].
  intros i Hi. rewrite length_keep, length_upd in Hi.
  rewrite get_keep, get_upd, get_upd by (rewrite ?length_keep; auto).
  destruct (Q i) eqn:Qi.
  - apply H3; auto. intros j Hj. rewrite get_keep, Hj. reflexivity.
  - rewrite H2 by auto. rewrite get_keep, Qi. reflexivity.
Qed.

(** ... and projecting on variables it does not write sees no change. *)
Lemma keep_upd_out Q R r x : confined Q r -> (forall i, R i = true -> Q i = false) ->
  keep R (upd x (snd r)) = keep R x.
Proof.
  intros (_ & H2 & _) HRQ. apply val_ext; [rewrite !length_keep, length_upd; auto|].
  intros i Hi. rewrite length_keep, length_upd in Hi. rewrite !get_keep.
  destruct (R i) eqn:Ri; auto. rewrite get_upd by auto. apply H2, HRQ, Ri.
Qed.

Lemma upd_zero Q r x : confined Q r -> zero_off Q x -> zero_off Q (upd x (snd r)).
Proof.
  intros (_ & H2 & _) Hx i Hi. destruct (Nat.lt_ge_cases i (length x)) as [H|H].
  - rewrite get_upd by auto. rewrite H2 by auto. apply Hx, Hi.
  - apply get_out. rewrite length_upd. auto.
Qed.

(** ** 4. A machine on its domain

    A verdict speaks of a machine's states only (each variable in its domain), not of every list
    of integers.  A domain closed under repair and events, with a normal form reached from each
    of its states, is a machine in the sense of Governance.v: its states are the subtype. *)

Lemma comp_path_pres {S : Type} (valid : S -> bool) (rho : S -> S) (I : S -> Prop) s t :
  (forall u, I u -> I (rho u)) -> comp_path S valid rho s t -> I s -> I t.
Proof. intros Hr H. induction H; auto. Qed.

(** Two states of a subtype given by a boolean test are equal when their values are. *)
Lemma sig_bool_eq {T : Type} (d : T -> bool) (p q : {x : T | d x = true}) : proj1_sig p = proj1_sig q -> p = q.
Proof.
  destruct p as [x hx], q as [y hy]; simpl. intros <-. f_equal. apply Eqdep_dec.UIP_dec, Bool.bool_dec.
Qed.

Section Restrict.
Variables (S E : Type) (dom : S -> bool) (valid : S -> bool) (rho : S -> S) (apply : E -> S -> S) (nf : S -> S).
Hypothesis dom_rho : forall s, dom s = true -> dom (rho s) = true.
Hypothesis dom_apply : forall e s, dom s = true -> dom (apply e s) = true.
Hypothesis path : forall s, dom s = true -> comp_path S valid rho s (nf s).

Definition D : Type := {s : S | dom s = true}.

Lemma dom_nf s : dom s = true -> dom (nf s) = true.
Proof. intros H. apply (comp_path_pres valid rho (fun u => dom u = true) s (nf s)); auto. Qed.

Definition d_valid (s : D) : bool := valid (proj1_sig s).
Definition d_rho (s : D) : D := exist _ (rho (proj1_sig s)) (dom_rho _ (proj2_sig s)).
Definition d_apply (e : E) (s : D) : D := exist _ (apply e (proj1_sig s)) (dom_apply e _ (proj2_sig s)).
Definition d_nf (s : D) : D := exist _ (nf (proj1_sig s)) (dom_nf _ (proj2_sig s)).

Lemma d_path_lift s t (ht : dom t = true) :
  comp_path S valid rho (proj1_sig s) t -> comp_path D d_valid d_rho s (exist _ t ht).
Proof.
  intros H. remember (proj1_sig s) as u eqn:Eu. revert s Eu ht. induction H as [u Hv|u t Hv _ IH]; intros s Eu ht; subst.
  - replace (exist _ (proj1_sig s) ht) with s by (apply sig_bool_eq; reflexivity). apply cp_done. exact Hv.
  - apply cp_step; [exact Hv|]. apply (IH (d_rho s)). reflexivity.
Qed.

Lemma d_path_proj s t : comp_path D d_valid d_rho s t -> comp_path S valid rho (proj1_sig s) (proj1_sig t).
Proof. induction 1 as [s Hv|s t Hv _ IH]; [apply cp_done; exact Hv|apply cp_step; auto]. Qed.

Lemma d_path s : comp_path D d_valid d_rho s (d_nf s).
Proof. apply d_path_lift, path, proj2_sig. Qed.

End Restrict.

(** ** 5. Splitting off one component *)

Section Split.
Variable lab : list nat.   (** the component of every variable *)
Variable c : nat.          (** the component split off: side A; every other component is side B *)
Variables (invs : list rule) (inv_lab : list nat) (evs : list rule) (ev_lab : list nat).
Hypothesis Hcheck : check_decomposition lab invs inv_lab evs ev_lab = true.

Definition inA (i : nat) : bool := in_comp lab c i.
Definition inB (i : nat) : bool := negb (in_comp lab c i).
Definition isA (l : nat) : bool := Nat.eqb l c.
Definition isB (l : nat) : bool := negb (Nat.eqb l c).

(** The two projected machines: side A has the invariants and events labelled [c], side B the rest
    (in declaration order). *)
Definition invsA : list rule := keep_rules isA invs inv_lab.
Definition invsB : list rule := keep_rules isB invs inv_lab.
Definition evsA : list rule := keep_rules isA evs ev_lab.
Definition evsB : list rule := keep_rules isB evs ev_lab.

(** The projection of a whole state on the pair of sides, and back. *)
Definition split (x : val) : val * val := (keep inA x, keep inB x).
Definition merge (a b : val) : val := map (fun i => if inA i then get a i else get b i) (seq 0 (length a)).

Lemma merge_split x : merge (keep inA x) (keep inB x) = x.
Proof.
  unfold merge. apply val_ext; [rewrite map_length, seq_length, length_keep; auto|].
  intros i Hi. rewrite map_length, seq_length, length_keep in Hi.
  unfold get at 1. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length, length_keep; auto).
  rewrite seq_nth by (rewrite length_keep; auto). simpl. rewrite !get_keep. unfold inB, inA.
  destruct (in_comp lab c i); reflexivity.
Qed.

(** [split] is injective: the whole state is recovered from its projections. *)
Lemma split_inj x y : split x = split y -> x = y.
Proof.
  unfold split. intros H. injection H as H1 H2. rewrite <- (merge_split x), <- (merge_split y). congruence.
Qed.

Lemma get_merge a b i : i < length a -> get (merge a b) i = if inA i then get a i else get b i.
Proof.
  intros H. unfold get at 1, merge. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto).
  rewrite seq_nth by auto. reflexivity.
Qed.

Lemma length_merge a b : length (merge a b) = length a.
Proof. unfold merge. rewrite map_length, seq_length. reflexivity. Qed.

Lemma split_merge a b : zero_off inA a -> zero_off inB b -> length b = length a ->
  split (merge a b) = (a, b).
Proof.
  intros Ha Hb Hl. unfold split. f_equal; apply val_ext; rewrite ?length_keep, ?length_merge; auto.
  - intros i Hi. rewrite get_keep, get_merge by auto. destruct (inA i) eqn:E; auto. symmetry. apply Ha, E.
  - intros i Hi. rewrite get_keep, get_merge by auto. unfold inB in *. unfold inA in *.
    destruct (in_comp lab c i) eqn:E; simpl; auto. symmetry. apply Hb. rewrite E. reflexivity.
Qed.

(** Every rule of side A is confined to A's variables, every rule of side B to B's. *)
Lemma label_confined r l : rule_in lab l r = true ->
  if isA l then confined inA r else confined inB r.
Proof.
  intros H. unfold isA. destruct (Nat.eqb l c) eqn:E.
  - apply Nat.eqb_eq in E. subst. apply rule_in_confined. exact H.
  - apply Nat.eqb_neq in E. apply (rule_in_confined_other lab c l r H E).
Qed.

Lemma Hinvs : rules_in lab invs inv_lab true = true.
Proof. unfold check_decomposition in Hcheck. apply andb_prop in Hcheck as [H _]. exact H. Qed.
Lemma Hevs : rules_in lab evs ev_lab true = true.
Proof. unfold check_decomposition in Hcheck. apply andb_prop in Hcheck as [_ H]. exact H. Qed.

(** The side whose invariant the whole machine repairs first: [true] for A. *)
Fixpoint first_side (rs : list rule) (ls : list nat) (x : val) : bool :=
  match rs, ls with
  | r :: rt, l :: lt => if holds x (fst r) then first_side rt lt x else isA l
  | _, _ => false
  end.

Lemma inB_inA i : inB i = true -> inA i = false.
Proof. unfold inB, inA. destruct (in_comp lab c i); auto. Qed.
Lemma inA_inB i : inA i = true -> inB i = false.
Proof. unfold inB, inA. destruct (in_comp lab c i); auto. Qed.

Lemma keep_rules_cons side r rt l lt :
  keep_rules side (r :: rt) (l :: lt) = if side l then r :: keep_rules side rt lt else keep_rules side rt lt.
Proof. reflexivity. Qed.
Lemma rvalid_cons r t x : rvalid (r :: t) x = holds x (fst r) && rvalid t x.
Proof. reflexivity. Qed.
Lemma first_side_cons r rt l lt x :
  first_side (r :: rt) (l :: lt) x = if holds x (fst r) then first_side rt lt x else isA l.
Proof. reflexivity. Qed.
Lemma rrepair_cons r t x : rrepair (r :: t) x = if holds x (fst r) then rrepair t x else upd x (snd r).
Proof. reflexivity. Qed.

(** The repair loop, invariant by invariant: validity is the conjunction of the sides', and a
    repair step changes only the side of the first violated invariant, as that side's own first
    violated invariant. *)
Lemma repair_split_aux rs ls x : rules_in lab rs ls true = true ->
  rvalid rs x = rvalid (keep_rules isA rs ls) (keep inA x) && rvalid (keep_rules isB rs ls) (keep inB x) /\
  (rvalid rs x = false ->
     if first_side rs ls x
     then rvalid (keep_rules isA rs ls) (keep inA x) = false
          /\ keep inA (rrepair rs x) = rrepair (keep_rules isA rs ls) (keep inA x)
          /\ keep inB (rrepair rs x) = keep inB x
     else rvalid (keep_rules isB rs ls) (keep inB x) = false
          /\ keep inA (rrepair rs x) = keep inA x
          /\ keep inB (rrepair rs x) = rrepair (keep_rules isB rs ls) (keep inB x)).
Proof.
  revert ls. induction rs as [|r rt IH]; intros [|l lt] H; simpl in H; try discriminate.
  - split; [reflexivity|discriminate].
  - apply rules_in_cons in H as [Hr Ht]. destruct (IH lt Ht) as [IHv IHr].
    pose proof (label_confined r l Hr) as Cf.
    assert (Bl : isB l = negb (isA l)) by reflexivity.
    rewrite !keep_rules_cons, Bl, !rvalid_cons, first_side_cons, rrepair_cons.
    destruct (isA l) eqn:Al; cbn [negb].
    + rewrite rvalid_cons, rrepair_cons, (holds_keep inA r x Cf). destruct (holds x (fst r)) eqn:Hx; cbn [andb].
      * split; auto.
      * split; [reflexivity|intros _]. split; [reflexivity|split].
        -- apply keep_upd_in; auto.
        -- apply (keep_upd_out inA inB r x Cf inB_inA).
    + rewrite rvalid_cons, rrepair_cons, (holds_keep inB r x Cf). destruct (holds x (fst r)) eqn:Hx; cbn [andb].
      * split; auto.
      * rewrite andb_false_r. split; [reflexivity|intros _]. split; [reflexivity|split].
        -- apply (keep_upd_out inB inA r x Cf inA_inB).
        -- apply keep_upd_in; auto.
Qed.

(** *** The product of the two projected machines (Compose.v, part 2) *)

Definition validA : val -> bool := rvalid invsA.
Definition validB : val -> bool := rvalid invsB.
Definition rhoA : val -> val := rrepair invsA.
Definition rhoB : val -> val := rrepair invsB.
Definition applyA : nat -> val -> val := revent evsA.
Definition applyB : nat -> val -> val := revent evsB.

(** The product repairs the half the whole machine's first violated invariant belongs to. *)
Definition pick (a b : val) : bool := first_side invs inv_lab (merge a b).

Definition pvalid : val * val -> bool := Compose.valid val val validA validB.
Definition prho : val * val -> val * val := Compose.rho val val validA validB rhoA rhoB pick.
Definition papply : nat + nat -> val * val -> val * val := Compose.apply val val nat nat applyA applyB.

(** The event of the product that whole event [k] is: its index in its own side's event list. *)
Fixpoint count_side (side : nat -> bool) (ls : list nat) (k : nat) : nat :=
  match ls, k with
  | l :: lt, S k' => (if side l then 1 else 0) + count_side side lt k'
  | _, _ => 0
  end.

Definition to_pe (k : nat) : nat + nat :=
  if isA (nth k ev_lab c) then inl (count_side isA ev_lab k) else inr (count_side isB ev_lab k).

(** The whole machine *)
Definition validW : val -> bool := rvalid invs.
Definition rhoW : val -> val := rrepair invs.
Definition applyW : nat -> val -> val := revent evs.

(** Validity: the whole state is valid exactly when both projections are. *)
Theorem rules_valid_split x : validW x = pvalid (split x).
Proof. apply (repair_split_aux invs inv_lab x Hinvs). Qed.

(** Repair: one repair step of the whole machine is one repair step of the product. *)
Theorem rules_repair_split x : split (rhoW x) = prho (split x).
Proof.
  destruct (repair_split_aux invs inv_lab x Hinvs) as [Hv Hr].
  change (rvalid (keep_rules isA invs inv_lab)) with validA in Hv, Hr.
  change (rvalid (keep_rules isB invs inv_lab)) with validB in Hv, Hr.
  change (rrepair (keep_rules isA invs inv_lab)) with rhoA in Hr.
  change (rrepair (keep_rules isB invs inv_lab)) with rhoB in Hr.
  change (rvalid invs x) with (validW x) in Hv, Hr. change (rrepair invs x) with (rhoW x) in Hr.
  unfold prho, Compose.rho, split, pick. cbn [fst snd]. rewrite merge_split.
  destruct (validW x) eqn:V.
  - symmetry in Hv. apply andb_prop in Hv as [VA VB]. unfold validW, rhoW in *.
    rewrite rrepair_valid by auto. rewrite VA. cbn [negb andb]. unfold rhoB. rewrite rrepair_valid by auto.
    reflexivity.
  - specialize (Hr eq_refl). destruct (first_side invs inv_lab x); destruct Hr as (H1 & H2 & H3).
    + rewrite H1. cbn [negb andb orb]. rewrite H2, H3. reflexivity.
    + rewrite H1, orb_false_r, H2, H3. destruct (validA (keep inA x)); reflexivity.
Qed.

Lemma nth_keep_rules side rs ls k : rules_in lab rs ls true = true -> k < length rs -> side (nth k ls c) = true ->
  nth (count_side side ls k) (keep_rules side rs ls) noev = nth k rs noev
  /\ rule_in lab (nth k ls c) (nth k rs noev) = true.
Proof.
  revert ls k. induction rs as [|r rt IH]; intros [|l lt] k H Hk Hs; simpl in *; try discriminate; try lia.
  apply rules_in_cons in H as [Hr Ht]. destruct k as [|k]; simpl.
  - rewrite Hs. auto.
  - destruct (side l); simpl; apply IH; auto; lia.
Qed.

Lemma rapply_keep_in Q R r x : confined Q r -> (forall i, R i = true -> Q i = false) ->
  keep Q (rapply r x) = rapply r (keep Q x) /\ keep R (rapply r x) = keep R x.
Proof.
  intros Cf HRQ. unfold rapply. rewrite (holds_keep Q r x Cf).
  destruct (holds x (fst r)); auto. split; [apply keep_upd_in|apply (keep_upd_out Q R)]; auto.
Qed.

(** Events: whole event [k] is the product's event [to_pe k], acting on its own half only. *)
Theorem rules_apply_split k x : split (applyW k x) = papply (to_pe k) (split x).
Proof.
  unfold applyW, revent, to_pe, papply, Compose.apply, split. simpl.
  destruct (Nat.lt_ge_cases k (length evs)) as [Hk|Hk].
  - destruct (isA (nth k ev_lab c)) eqn:Al; simpl.
    + destruct (nth_keep_rules isA evs ev_lab k Hevs Hk Al) as [E R].
      unfold applyA, revent, evsA. rewrite E.
      pose proof (label_confined _ _ R) as Cf. rewrite Al in Cf.
      destruct (rapply_keep_in inA inB _ x Cf inB_inA) as [H1 H2]. rewrite H1, H2. reflexivity.
    + assert (Bl : isB (nth k ev_lab c) = true) by (unfold isB; unfold isA in Al; rewrite Al; auto).
      destruct (nth_keep_rules isB evs ev_lab k Hevs Hk Bl) as [E R].
      unfold applyB, revent, evsB. rewrite E.
      pose proof (label_confined _ _ R) as Cf. rewrite Al in Cf.
      destruct (rapply_keep_in inB inA _ x Cf inA_inB) as [H1 H2]. rewrite H1, H2. reflexivity.
  - assert (Out : forall side, rules_in lab evs ev_lab true = true ->
              length (keep_rules side evs ev_lab) <= count_side side ev_lab k).
    { intros side H. clear -H Hk. revert ev_lab k H Hk. induction evs as [|r rt IH]; intros [|l lt] k H Hk;
        simpl in *; try discriminate; try lia.
      apply rules_in_cons in H as [_ Ht]. destruct k as [|k]; [lia|].
      destruct (side l); simpl; [apply le_n_S|]; apply IH; auto; lia. }
    rewrite nth_overflow by auto.
    destruct (isA (nth k ev_lab c)); simpl; f_equal;
      [unfold applyA, revent, evsA|unfold applyB, revent, evsB];
      rewrite nth_overflow by (apply Out, Hevs); reflexivity.
Qed.

(** *** Each side's rules stay on their side *)

Lemma noev_confined Q : confined Q noev.
Proof. split; [|split]; intros x; [reflexivity|reflexivity|intros y i H Hi; apply H, Hi]. Qed.

Lemma keep_rules_confined side Q rs ls : rules_in lab rs ls true = true ->
  (forall l r, side l = true -> rule_in lab l r = true -> confined Q r) ->
  forall k, confined Q (nth k (keep_rules side rs ls) noev).
Proof.
  intros H Hs. revert ls H. induction rs as [|r rt IH]; intros [|l lt] H k; simpl in *;
    try (destruct k; apply noev_confined).
  apply rules_in_cons in H as [Hr Ht]. destruct (side l) eqn:Sl; [destruct k as [|k]; simpl|]; auto.
  apply (Hs l); auto.
Qed.

Lemma confined_A rs ls k : rules_in lab rs ls true = true -> confined inA (nth k (keep_rules isA rs ls) noev).
Proof.
  intros H. apply keep_rules_confined; auto. intros l r Hl Hr.
  pose proof (label_confined r l Hr) as Cf. rewrite Hl in Cf. exact Cf.
Qed.

Lemma confined_B rs ls k : rules_in lab rs ls true = true -> confined inB (nth k (keep_rules isB rs ls) noev).
Proof.
  intros H. apply keep_rules_confined; auto. intros l r Hl Hr.
  pose proof (label_confined r l Hr) as Cf. unfold isB in Hl. unfold isA in Cf.
  destruct (Nat.eqb l c); [discriminate|exact Cf].
Qed.

(** States of a side: zero off that side's variables, of the whole machine's length. *)
Definition side_state (Q : nat -> bool) (m : nat) (a : val) : Prop := zero_off Q a /\ length a = m.

Lemma rrepair_side Q rs m a : (forall k, confined Q (nth k rs noev)) -> side_state Q m a ->
  side_state Q m (rrepair rs a).
Proof.
  induction rs as [|r rt IH]; intros Hc Ha; simpl; auto.
  destruct (holds a (fst r)).
  - apply IH; auto. intros k. apply (Hc (S k)).
  - destruct Ha as [Hz Hl]. split; [apply upd_zero; auto; apply (Hc 0)|rewrite length_upd; auto].
Qed.

Lemma revent_side Q rs m k a : (forall k, confined Q (nth k rs noev)) -> side_state Q m a ->
  side_state Q m (revent rs k a).
Proof.
  intros Hc [Hz Hl]. unfold revent, rapply. destruct (holds a _); [|split; auto].
  split; [apply upd_zero; auto|rewrite length_upd; auto].
Qed.


(** ** 6. The whole machine is the product *)

Section Product.
(** What the components' own verdicts give (Compose.v's hypotheses, for the projected machines). *)
Variables (nfA nfB : val -> val) (phiA phiB : val -> nat) (indepA indepB : nat -> nat -> Prop).
Hypothesis wfcA : forall a, validA a = false -> phiA (rhoA a) < phiA a.
Hypothesis wfcB : forall b, validB b = false -> phiB (rhoB b) < phiB b.
Hypothesis pathA : forall a, comp_path val validA rhoA a (nfA a).
Hypothesis pathB : forall b, comp_path val validB rhoB b (nfB b).
Hypothesis cc1A : forall a b s, indepA a b -> validA s = true ->
  stepA val nat applyA nfA b (stepA val nat applyA nfA a s) = stepA val nat applyA nfA a (stepA val nat applyA nfA b s).
Hypothesis cc1B : forall a b s, indepB a b -> validB s = true ->
  stepB val nat applyB nfB b (stepB val nat applyB nfB a s) = stepB val nat applyB nfB a (stepB val nat applyB nfB b s).
Hypothesis cc2A : forall e s, stepA val nat applyA nfA e s = stepA val nat applyA nfA e (nfA s).
Hypothesis cc2B : forall e s, stepB val nat applyB nfB e s = stepB val nat applyB nfB e (nfB s).

Definition pnf : val * val -> val * val := Compose.nf val val nfA nfB.
Definition pstep : nat + nat -> val * val -> val * val := Compose.step val val nat nat applyA applyB nfA nfB.

(** The whole machine's normal form, its normalized steps, and its independence relation: two
    events of one component are independent when that component declares them so, two events of
    different components always are. *)
Definition nfW (x : val) : val := merge (nfA (keep inA x)) (nfB (keep inB x)).
Definition stepW : nat -> val -> val := Governance.step val nat applyW nfW.
Definition indepW (k l : nat) : Prop := Compose.indep nat nat indepA indepB (to_pe k) (to_pe l).

Lemma nfA_side m a : side_state inA m a -> side_state inA m (nfA a).
Proof.
  intros H. apply (comp_path_pres validA rhoA (side_state inA m) a); auto.
  intros u Hu. apply rrepair_side; auto. intros k. apply confined_A, Hinvs.
Qed.

Lemma nfB_side m b : side_state inB m b -> side_state inB m (nfB b).
Proof.
  intros H. apply (comp_path_pres validB rhoB (side_state inB m) b); auto.
  intros u Hu. apply rrepair_side; auto. intros k. apply confined_B, Hinvs.
Qed.

(** The normal form of the whole is the pair of the components' normal forms. *)
Theorem rules_nf_split x : split (nfW x) = pnf (split x).
Proof.
  destruct (nfA_side (length x) (keep inA x)) as [ZA LA]; [split; [apply keep_zero|apply length_keep]|].
  destruct (nfB_side (length x) (keep inB x)) as [ZB LB]; [split; [apply keep_zero|apply length_keep]|].
  unfold nfW. rewrite split_merge by (auto; congruence). reflexivity.
Qed.

(** A repair path of the product from [split x] is one of the whole machine from [x], and back. *)
Lemma path_of_product x p : comp_path (val * val) pvalid prho (split x) p ->
  comp_path val validW rhoW x (merge (fst p) (snd p)).
Proof.
  remember (split x) as q eqn:Eq. intros H. revert x Eq. induction H as [q Hv|q t Hv _ IH]; intros x Eq; subst.
  - cbn [split fst snd]. rewrite merge_split. apply cp_done. rewrite rules_valid_split. exact Hv.
  - apply cp_step; [rewrite rules_valid_split; exact Hv|]. apply IH. symmetry. apply rules_repair_split.
Qed.

Lemma product_of_path x t : comp_path val validW rhoW x t -> comp_path (val * val) pvalid prho (split x) (split t).
Proof.
  induction 1 as [x Hv|x t Hv _ IH].
  - apply cp_done. rewrite <- rules_valid_split. exact Hv.
  - apply cp_step; [rewrite <- rules_valid_split; exact Hv|]. rewrite <- rules_repair_split. exact IH.
Qed.

(** The whole machine's own repair loop (first violated invariant first) ends at [nfW x], from
    every state; and a repair path of the whole ends at [t] exactly when the product's repair path
    from the projections ends at the projections of [t]. *)
Theorem rules_nf_path x : comp_path val validW rhoW x (nfW x).
Proof.
  change (nfW x) with (merge (fst (pnf (split x))) (snd (pnf (split x)))). apply path_of_product.
  apply (compose_nf_path val val validA validB rhoA rhoB nfA nfB phiA phiB wfcA wfcB pathA pathB pick).
Qed.

(** A repair path of the whole from [x] ends at [t] exactly when the product's from [split x] ends at [split t]. *)
Theorem rules_nf_iff x t : comp_path val validW rhoW x t <-> comp_path (val * val) pvalid prho (split x) (split t).
Proof.
  split; [apply product_of_path|]. intros H. rewrite <- (merge_split t). apply (path_of_product x (split t) H).
Qed.

(** Steps: a normalized step of the whole machine is the product's normalized step. *)
Theorem rules_step_split k x : split (stepW k x) = pstep (to_pe k) (split x).
Proof. unfold stepW, Governance.step. rewrite rules_nf_split, rules_apply_split. reflexivity. Qed.

(** WFC of the whole machine: the sum of the components' potentials decreases at every repair. *)
Theorem rules_wfc : forall x, validW x = false ->
  phiA (keep inA (rhoW x)) + phiB (keep inB (rhoW x)) < phiA (keep inA x) + phiB (keep inB x).
Proof.
  intros x Hv. rewrite rules_valid_split in Hv.
  pose proof (compose_wfc val val validA validB rhoA rhoB phiA phiB wfcA wfcB pick (split x) Hv) as W.
  fold prho in W. rewrite <- rules_repair_split in W. exact W.
Qed.

(** CC1 of the whole machine, from the components' CC1 (no CC2 needed). *)
Theorem rules_cc1 : forall k l x, indepW k l -> validW x = true -> stepW l (stepW k x) = stepW k (stepW l x).
Proof.
  intros k l x Hi Hv. apply split_inj. rewrite !rules_step_split.
  apply (compose_cc1 val val nat nat validA validB rhoA rhoB applyA applyB indepA indepB nfA nfB
           pathA pathB cc1A cc1B); auto.
  rewrite <- rules_valid_split. exact Hv.
Qed.

(** CC2 of the whole machine, from the components' CC2. *)
Theorem rules_cc2 : forall k x, stepW k x = stepW k (nfW x).
Proof.
  intros k x. apply split_inj. rewrite !rules_step_split, rules_nf_split.
  apply (compose_cc2 val val nat nat validA validB rhoA rhoB applyA applyB nfA nfB pathA pathB cc2A cc2B).
Qed.

Lemma rules_wfc_ex : exists phi : val -> nat, forall x, validW x = false -> phi (rhoW x) < phi x.
Proof. exists (fun x => phiA (keep inA x) + phiB (keep inB x)). apply rules_wfc. Qed.

(** Convergence of the whole rules machine, from the components' verdicts: every run of the full
    rewrite system (delivery of a bag of pairwise-independent events, compensation by the whole
    machine's own repair interleaved in any way) ends in the same valid state ... *)
Theorem rules_unique_normal_forms : forall cf s1 s2,
  star (G val nat Nat.eq_dec validW rhoW applyW indepW) cf (s1, []) ->
  star (G val nat Nat.eq_dec validW rhoW applyW indepW) cf (s2, []) ->
  validW s1 = true -> validW s2 = true -> s1 = s2.
Proof.
  apply (gov_unique_normal_forms val nat Nat.eq_dec validW rhoW applyW indepW nfW
           rules_wfc_ex rules_nf_path rules_cc1 rules_cc2).
Qed.

(** ... and every delivery order of the same pairwise-independent events, compensating after each,
    reaches that same state. *)
Theorem rules_stream_convergence : forall s b es1 es2,
  pw nat indepW b -> Permutation es1 b -> Permutation es2 b ->
  fold_left (fun t e => stepW e t) es1 (nfW s) = fold_left (fun t e => stepW e t) es2 (nfW s)
  /\ (forall t, star (G val nat Nat.eq_dec validW rhoW applyW indepW) (s, b) (t, []) -> validW t = true ->
        t = fold_left (fun t e => stepW e t) es1 (nfW s)).
Proof.
  apply (stream_convergence val nat Nat.eq_dec validW rhoW applyW indepW nfW
           rules_wfc_ex rules_nf_path rules_cc1 rules_cc2).
Qed.

End Product.

(** ** 7. On the components' domains

    What a component's verdict gives holds on its states only (every variable in its domain).
    The same conclusions hold with every hypothesis restricted to domains [domA], [domB] (any
    tests closed under the side's repair and events, such as "each variable in its range"):
    the whole machine's domain is the set of states both of whose projections are in their
    side's domain, and on it the whole machine is the product of the two components restricted
    to their domains, and converges. *)

Section Domain.
Variables (domA domB : val -> bool).
Hypothesis domA_rho : forall a, domA a = true -> domA (rhoA a) = true.
Hypothesis domA_apply : forall e a, domA a = true -> domA (applyA e a) = true.
Hypothesis domB_rho : forall b, domB b = true -> domB (rhoB b) = true.
Hypothesis domB_apply : forall e b, domB b = true -> domB (applyB e b) = true.
Variables (nfA nfB : val -> val) (phiA phiB : val -> nat) (indepA indepB : nat -> nat -> Prop).
Hypothesis wfcA : forall a, domA a = true -> validA a = false -> phiA (rhoA a) < phiA a.
Hypothesis wfcB : forall b, domB b = true -> validB b = false -> phiB (rhoB b) < phiB b.
Hypothesis pathA : forall a, domA a = true -> comp_path val validA rhoA a (nfA a).
Hypothesis pathB : forall b, domB b = true -> comp_path val validB rhoB b (nfB b).
Hypothesis cc1A : forall ea eb a, indepA ea eb -> domA a = true -> validA a = true ->
  stepA val nat applyA nfA eb (stepA val nat applyA nfA ea a) = stepA val nat applyA nfA ea (stepA val nat applyA nfA eb a).
Hypothesis cc1B : forall ea eb b, indepB ea eb -> domB b = true -> validB b = true ->
  stepB val nat applyB nfB eb (stepB val nat applyB nfB ea b) = stepB val nat applyB nfB ea (stepB val nat applyB nfB eb b).
Hypothesis cc2A : forall e a, domA a = true -> stepA val nat applyA nfA e a = stepA val nat applyA nfA e (nfA a).
Hypothesis cc2B : forall e b, domB b = true -> stepB val nat applyB nfB e b = stepB val nat applyB nfB e (nfB b).

(** *** The components as machines on their domains, and their product *)

Definition SA : Type := D val domA.
Definition SB : Type := D val domB.
Definition vA : SA -> bool := d_valid val domA validA.
Definition vB : SB -> bool := d_valid val domB validB.
Definition rA : SA -> SA := d_rho val domA rhoA domA_rho.
Definition rB : SB -> SB := d_rho val domB rhoB domB_rho.
Definition apA : nat -> SA -> SA := d_apply val nat domA applyA domA_apply.
Definition apB : nat -> SB -> SB := d_apply val nat domB applyB domB_apply.
Definition nA : SA -> SA := d_nf val domA validA rhoA nfA domA_rho pathA.
Definition nB : SB -> SB := d_nf val domB validB rhoB nfB domB_rho pathB.
Definition fA (a : SA) : nat := phiA (proj1_sig a).
Definition fB (b : SB) : nat := phiB (proj1_sig b).
Definition pickS (a : SA) (b : SB) : bool := pick (proj1_sig a) (proj1_sig b).

Lemma wfcA' : forall a : SA, vA a = false -> fA (rA a) < fA a.
Proof. intros a. apply wfcA, proj2_sig. Qed.
Lemma wfcB' : forall b : SB, vB b = false -> fB (rB b) < fB b.
Proof. intros b. apply wfcB, proj2_sig. Qed.
Lemma pathA' : forall a : SA, comp_path SA vA rA a (nA a).
Proof. apply d_path. Qed.
Lemma pathB' : forall b : SB, comp_path SB vB rB b (nB b).
Proof. apply d_path. Qed.
Lemma cc1A' : forall ea eb a, indepA ea eb -> vA a = true ->
  stepA SA nat apA nA eb (stepA SA nat apA nA ea a) = stepA SA nat apA nA ea (stepA SA nat apA nA eb a).
Proof. intros ea eb a H V. apply sig_bool_eq. apply cc1A; auto. apply proj2_sig. Qed.
Lemma cc1B' : forall ea eb b, indepB ea eb -> vB b = true ->
  stepB SB nat apB nB eb (stepB SB nat apB nB ea b) = stepB SB nat apB nB ea (stepB SB nat apB nB eb b).
Proof. intros ea eb b H V. apply sig_bool_eq. apply cc1B; auto. apply proj2_sig. Qed.
Lemma cc2A' : forall e a, stepA SA nat apA nA e a = stepA SA nat apA nA e (nA a).
Proof. intros e a. apply sig_bool_eq. apply cc2A, proj2_sig. Qed.
Lemma cc2B' : forall e b, stepB SB nat apB nB e b = stepB SB nat apB nB e (nB b).
Proof. intros e b. apply sig_bool_eq. apply cc2B, proj2_sig. Qed.

Definition pvS : SA * SB -> bool := Compose.valid SA SB vA vB.
Definition prS : SA * SB -> SA * SB := Compose.rho SA SB vA vB rA rB pickS.
Definition pstepS : nat + nat -> SA * SB -> SA * SB := Compose.step SA SB nat nat apA apB nA nB.
Definition pnfS : SA * SB -> SA * SB := Compose.nf SA SB nA nB.

(** Forgetting the domain proofs maps this product onto the product of the rules sides. *)
Definition projP (p : SA * SB) : val * val := (proj1_sig (fst p), proj1_sig (snd p)).

Lemma projP_valid p : pvS p = pvalid (projP p).
Proof. reflexivity. Qed.
Lemma projP_rho p : projP (prS p) = prho (projP p).
Proof.
  destruct p as [a b]. unfold prS, prho, Compose.rho, projP. cbn [fst snd].
  unfold vA, vB, d_valid, pickS. destruct (negb _ && _); reflexivity.
Qed.
Lemma projP_step e p : projP (pstepS e p) = pstep nfA nfB e (projP p).
Proof. destruct e; reflexivity. Qed.
Lemma projP_nf p : projP (pnfS p) = pnf nfA nfB (projP p).
Proof. reflexivity. Qed.
Lemma projP_inj p q : projP p = projP q -> p = q.
Proof.
  destruct p as [a b], q as [a' b']. unfold projP. cbn [fst snd]. intros H. injection H as H1 H2.
  f_equal; apply sig_bool_eq; auto.
Qed.

Lemma path_map p q : comp_path (SA * SB) pvS prS p q -> comp_path (val * val) pvalid prho (projP p) (projP q).
Proof.
  induction 1 as [p Hv|p q Hv _ IH]; [apply cp_done; exact Hv|].
  apply cp_step; [exact Hv|]. rewrite <- projP_rho. exact IH.
Qed.

(** *** The whole machine on its domain *)

(** The whole machine's domain: both projections in their side's domain. *)
Definition domW (x : val) : bool := domA (keep inA x) && domB (keep inB x).

Lemma split_dom x : domW x = true -> exists p, projP p = split x.
Proof.
  unfold domW. intros H. apply andb_prop in H as [HA HB].
  exists (exist _ (keep inA x) HA, exist _ (keep inB x) HB). reflexivity.
Qed.

Lemma domW_split x a b : split x = (a, b) -> domA a = true -> domB b = true -> domW x = true.
Proof. unfold split, domW. intros H HA HB. injection H as -> ->. rewrite HA, HB. reflexivity. Qed.

Lemma domW_parts x : domW x = true -> domA (keep inA x) = true /\ domB (keep inB x) = true.
Proof. unfold domW. intros H. apply andb_prop in H. exact H. Qed.

(** The whole machine's domain is closed under its repair ... *)
Theorem rules_dom_rho x : domW x = true -> domW (rhoW x) = true.
Proof.
  intros H. destruct (domW_parts x H) as [HA HB]. pose proof (rules_repair_split x) as E.
  unfold prho, Compose.rho, split in E. cbn [fst snd] in E.
  destruct (negb _ && _); apply (domW_split _ _ _ E); auto.
Qed.

(** ... and under its events. *)
Theorem rules_dom_apply k x : domW x = true -> domW (applyW k x) = true.
Proof.
  intros H. destruct (domW_parts x H) as [HA HB]. pose proof (rules_apply_split k x) as E.
  unfold papply, Compose.apply, split in E. cbn [fst snd] in E.
  destruct (to_pe k); apply (domW_split _ _ _ E); auto.
Qed.

Lemma nfA_side_d m a : domA a = true -> side_state inA m a -> side_state inA m (nfA a).
Proof.
  intros D H. apply (comp_path_pres validA rhoA (side_state inA m) a); auto.
  intros u Hu. apply rrepair_side; auto. intros k. apply confined_A, Hinvs.
Qed.

Lemma nfB_side_d m b : domB b = true -> side_state inB m b -> side_state inB m (nfB b).
Proof.
  intros D H. apply (comp_path_pres validB rhoB (side_state inB m) b); auto.
  intros u Hu. apply rrepair_side; auto. intros k. apply confined_B, Hinvs.
Qed.

(** The normal form of the whole is the pair of the components' normal forms. *)
Theorem rules_dom_nf_split x : domW x = true -> split (nfW nfA nfB x) = pnf nfA nfB (split x).
Proof.
  intros H. destruct (domW_parts x H) as [HA HB].
  destruct (nfA_side_d (length x) (keep inA x)) as [ZA LA]; auto; [split; [apply keep_zero|apply length_keep]|].
  destruct (nfB_side_d (length x) (keep inB x)) as [ZB LB]; auto; [split; [apply keep_zero|apply length_keep]|].
  unfold nfW. rewrite split_merge by (auto; congruence). reflexivity.
Qed.

(** The whole machine's own repair loop ends at that pair, from every state of its domain. *)
Theorem rules_dom_nf_path x : domW x = true -> comp_path val validW rhoW x (nfW nfA nfB x).
Proof.
  intros H. destruct (split_dom x H) as [p Hp].
  pose proof (compose_nf_path SA SB vA vB rA rB nA nB fA fB wfcA' wfcB' pathA' pathB' pickS p) as P.
  apply path_map in P. rewrite projP_nf, Hp in P.
  change (nfW nfA nfB x) with (merge (fst (pnf nfA nfB (split x))) (snd (pnf nfA nfB (split x)))).
  apply path_of_product. exact P.
Qed.

Lemma dom_nfW x : domW x = true -> domW (nfW nfA nfB x) = true.
Proof.
  intros H. apply (comp_path_pres validW rhoW (fun u => domW u = true) x); auto.
  - intros u Hu. apply rules_dom_rho, Hu.
  - apply rules_dom_nf_path, H.
Qed.

(** On the domain, a normalized step of the whole is the product's normalized step. *)
Theorem rules_dom_step_split k x : domW x = true -> split (stepW nfA nfB k x) = pstep nfA nfB (to_pe k) (split x).
Proof.
  intros H. unfold stepW, Governance.step. rewrite rules_dom_nf_split by (apply rules_dom_apply, H).
  rewrite rules_apply_split. reflexivity.
Qed.

Lemma dom_stepW k x : domW x = true -> domW (stepW nfA nfB k x) = true.
Proof. intros H. apply dom_nfW, rules_dom_apply, H. Qed.

(** WFC, CC1 and CC2 of the whole machine on its domain, by the product theorems of Compose.v. *)
Theorem rules_dom_wfc x : domW x = true -> validW x = false ->
  phiA (keep inA (rhoW x)) + phiB (keep inB (rhoW x)) < phiA (keep inA x) + phiB (keep inB x).
Proof.
  intros H Hv. destruct (split_dom x H) as [p Hp]. rewrite rules_valid_split, <- Hp in Hv.
  pose proof (compose_wfc SA SB vA vB rA rB fA fB wfcA' wfcB' pickS p Hv) as W.
  unfold fA, fB in W. change (proj1_sig (fst (Compose.rho SA SB vA vB rA rB pickS p))) with (fst (projP (prS p))) in W.
  change (proj1_sig (snd (Compose.rho SA SB vA vB rA rB pickS p))) with (snd (projP (prS p))) in W.
  change (proj1_sig (fst p)) with (fst (projP p)) in W. change (proj1_sig (snd p)) with (snd (projP p)) in W.
  rewrite projP_rho, Hp, <- rules_repair_split in W. exact W.
Qed.

(** CC1 on the domain: independent events commute at valid states (pairs across components always). *)
Theorem rules_dom_cc1 k l x : indepW indepA indepB k l -> domW x = true -> validW x = true ->
  stepW nfA nfB l (stepW nfA nfB k x) = stepW nfA nfB k (stepW nfA nfB l x).
Proof.
  intros Hi H Hv. destruct (split_dom x H) as [p Hp]. apply split_inj.
  rewrite !rules_dom_step_split by (auto using dom_stepW). rewrite <- Hp, <- !projP_step. f_equal.
  apply (compose_cc1 SA SB nat nat vA vB rA rB apA apB indepA indepB nA nB pathA' pathB' cc1A' cc1B'); auto.
  rewrite projP_valid, Hp, <- rules_valid_split. exact Hv.
Qed.

(** CC2 on the domain: normalizing before an event changes nothing. *)
Theorem rules_dom_cc2 k x : domW x = true -> stepW nfA nfB k x = stepW nfA nfB k (nfW nfA nfB x).
Proof.
  intros H. destruct (split_dom x H) as [p Hp]. apply split_inj.
  rewrite !rules_dom_step_split by (auto using dom_nfW). rewrite rules_dom_nf_split by auto.
  rewrite <- Hp, <- projP_nf, <- !projP_step. f_equal.
  apply (compose_cc2 SA SB nat nat vA vB rA rB apA apB nA nB pathA' pathB' cc2A' cc2B').
Qed.

(** *** Convergence of the whole rules machine on its domain *)

Definition SW : Type := D val domW.
Definition vW : SW -> bool := d_valid val domW validW.
Definition rW : SW -> SW := d_rho val domW rhoW rules_dom_rho.
Definition apW : nat -> SW -> SW := d_apply val nat domW applyW rules_dom_apply.
Definition nW : SW -> SW := d_nf val domW validW rhoW (nfW nfA nfB) rules_dom_rho rules_dom_nf_path.

Lemma sw_wfc : exists phi : SW -> nat, forall s, vW s = false -> phi (rW s) < phi s.
Proof.
  exists (fun s => phiA (keep inA (proj1_sig s)) + phiB (keep inB (proj1_sig s))).
  intros s Hv. apply rules_dom_wfc; auto. apply proj2_sig.
Qed.

Lemma sw_path s : comp_path SW vW rW s (nW s).
Proof. apply d_path. Qed.

Lemma sw_cc1 k l s : indepW indepA indepB k l -> vW s = true ->
  Governance.step SW nat apW nW l (Governance.step SW nat apW nW k s)
  = Governance.step SW nat apW nW k (Governance.step SW nat apW nW l s).
Proof. intros Hi Hv. apply sig_bool_eq. apply rules_dom_cc1; auto. apply proj2_sig. Qed.

Lemma sw_cc2 k s : Governance.step SW nat apW nW k s = Governance.step SW nat apW nW k (nW s).
Proof. apply sig_bool_eq. apply rules_dom_cc2, proj2_sig. Qed.

(** From the components' verdicts on their domains: every run of the whole rules machine's
    rewrite system from a state of its domain (delivery of pairwise-independent events,
    compensation by the whole machine's own repair interleaved in any way) ends in the same
    valid state ... *)
Theorem rules_dom_unique_normal_forms : forall cf s1 s2,
  star (G SW nat Nat.eq_dec vW rW apW (indepW indepA indepB)) cf (s1, []) ->
  star (G SW nat Nat.eq_dec vW rW apW (indepW indepA indepB)) cf (s2, []) ->
  vW s1 = true -> vW s2 = true -> s1 = s2.
Proof.
  apply (gov_unique_normal_forms SW nat Nat.eq_dec vW rW apW (indepW indepA indepB) nW sw_wfc sw_path sw_cc1 sw_cc2).
Qed.

(** ... which every delivery order of the same events reaches, compensating after each. *)
Theorem rules_dom_stream_convergence : forall s b es1 es2,
  pw nat (indepW indepA indepB) b -> Permutation es1 b -> Permutation es2 b ->
  fold_left (fun t e => Governance.step SW nat apW nW e t) es1 (nW s)
  = fold_left (fun t e => Governance.step SW nat apW nW e t) es2 (nW s)
  /\ (forall t, star (G SW nat Nat.eq_dec vW rW apW (indepW indepA indepB)) (s, b) (t, []) -> vW t = true ->
        t = fold_left (fun t e => Governance.step SW nat apW nW e t) es1 (nW s)).
Proof.
  apply (stream_convergence SW nat Nat.eq_dec vW rW apW (indepW indepA indepB) nW sw_wfc sw_path sw_cc1 sw_cc2).
Qed.

(** *** Obligations and idempotence are the components' own *)

Lemma nfA_fix a : domA a = true -> validA a = true -> nfA a = a.
Proof. intros D H. apply (comp_path_det val validA rhoA a); auto. apply cp_done. exact H. Qed.
Lemma nfB_fix b : domB b = true -> validB b = true -> nfB b = b.
Proof. intros D H. apply (comp_path_det val validB rhoB b); auto. apply cp_done. exact H. Qed.

Lemma split_valid_parts x : validW x = true -> validA (keep inA x) = true /\ validB (keep inB x) = true.
Proof. intros H. rewrite rules_valid_split in H. apply andb_prop in H. exact H. Qed.

Lemma pstep_inl ea p : pstep nfA nfB (inl ea) p = (stepA val nat applyA nfA ea (fst p), nfB (snd p)).
Proof. reflexivity. Qed.
Lemma pstep_inr eb p : pstep nfA nfB (inr eb) p = (nfA (fst p), stepB val nat applyB nfB eb (snd p)).
Proof. reflexivity. Qed.

Lemma keep_side_A x : side_state inA (length x) (keep inA x).
Proof. split; [apply keep_zero|apply length_keep]. Qed.
Lemma keep_side_B x : side_state inB (length x) (keep inB x).
Proof. split; [apply keep_zero|apply length_keep]. Qed.

(** A state of side A completed by the B part of a whole state [y] is a whole state (of the
    domain and valid when both parts are). *)
Lemma complete_A a y : side_state inA (length y) a ->
  split (merge a (keep inB y)) = (a, keep inB y) /\ length (merge a (keep inB y)) = length y.
Proof.
  intros [Za La]. split; [apply split_merge; rewrite ?length_keep; auto using keep_zero|].
  rewrite length_merge. exact La.
Qed.

Lemma complete_B b y : side_state inB (length y) b ->
  split (merge (keep inA y) b) = (keep inA y, b) /\ length (merge (keep inA y) b) = length y.
Proof.
  intros [Zb Lb]. split; [apply split_merge; rewrite ?length_keep; auto using keep_zero|].
  rewrite length_merge, length_keep. reflexivity.
Qed.

(** Two events of component [c] (side A) commute on the valid states of the whole machine's
    domain exactly when they commute on the valid states of side A's domain (states of the
    length of a valid whole state [y] of the domain: the number of variables). *)
Theorem rules_commute_iff_A k l ea eb y : to_pe k = inl ea -> to_pe l = inl eb -> domW y = true -> validW y = true ->
  (forall a, side_state inA (length y) a -> domA a = true -> validA a = true ->
     stepA val nat applyA nfA eb (stepA val nat applyA nfA ea a) = stepA val nat applyA nfA ea (stepA val nat applyA nfA eb a)) <->
  (forall x, length x = length y -> domW x = true -> validW x = true ->
     stepW nfA nfB l (stepW nfA nfB k x) = stepW nfA nfB k (stepW nfA nfB l x)).
Proof.
  intros Hk Hl Dy Vy. split.
  - intros H x Lx Dx Vx. apply split_inj. rewrite !rules_dom_step_split by (auto using dom_stepW).
    rewrite Hk, Hl, !pstep_inl. unfold split. cbn [fst snd]. rewrite H; auto.
    + rewrite <- Lx. apply keep_side_A.
    + apply domW_parts, Dx.
    + apply split_valid_parts, Vx.
  - intros H a Sa Da Va. destruct (complete_A a y Sa) as [Ez Lz].
    assert (Dz : domW (merge a (keep inB y)) = true) by (apply (domW_split _ _ _ Ez); auto; apply domW_parts, Dy).
    assert (Vz : validW (merge a (keep inB y)) = true).
    { rewrite rules_valid_split, Ez. unfold pvalid, Compose.valid. cbn [fst snd]. rewrite Va.
      apply split_valid_parts, Vy. }
    specialize (H _ Lz Dz Vz). apply (f_equal split) in H. rewrite !rules_dom_step_split in H by (auto using dom_stepW).
    rewrite Hk, Hl, Ez, !pstep_inl in H. cbn [fst snd] in H. injection H as H. exact H.
Qed.

(** The same for two events of the other components (side B). *)
Theorem rules_commute_iff_B k l eb1 eb2 y : to_pe k = inr eb1 -> to_pe l = inr eb2 -> domW y = true -> validW y = true ->
  (forall b, side_state inB (length y) b -> domB b = true -> validB b = true ->
     stepB val nat applyB nfB eb2 (stepB val nat applyB nfB eb1 b) = stepB val nat applyB nfB eb1 (stepB val nat applyB nfB eb2 b)) <->
  (forall x, length x = length y -> domW x = true -> validW x = true ->
     stepW nfA nfB l (stepW nfA nfB k x) = stepW nfA nfB k (stepW nfA nfB l x)).
Proof.
  intros Hk Hl Dy Vy. split.
  - intros H x Lx Dx Vx. apply split_inj. rewrite !rules_dom_step_split by (auto using dom_stepW).
    rewrite Hk, Hl, !pstep_inr. unfold split. cbn [fst snd]. rewrite H; auto.
    + rewrite <- Lx. apply keep_side_B.
    + apply domW_parts, Dx.
    + apply split_valid_parts, Vx.
  - intros H b Sb Db Vb. destruct (complete_B b y Sb) as [Ez Lz].
    assert (Dz : domW (merge (keep inA y) b) = true) by (apply (domW_split _ _ _ Ez); auto; apply domW_parts, Dy).
    assert (Vz : validW (merge (keep inA y) b) = true).
    { rewrite rules_valid_split, Ez. unfold pvalid, Compose.valid. cbn [fst snd]. rewrite Vb, andb_true_r.
      apply split_valid_parts, Vy. }
    specialize (H _ Lz Dz Vz). apply (f_equal split) in H. rewrite !rules_dom_step_split in H by (auto using dom_stepW).
    rewrite Hk, Hl, Ez, !pstep_inr in H. cbn [fst snd] in H. injection H as H. exact H.
Qed.

(** An event of component [c] is idempotent on the valid states of the whole machine's domain
    exactly when it is on the valid states of side A's domain. *)
Theorem rules_idem_iff_A k ea y : to_pe k = inl ea -> domW y = true -> validW y = true ->
  (forall a, side_state inA (length y) a -> domA a = true -> validA a = true ->
     stepA val nat applyA nfA ea (stepA val nat applyA nfA ea a) = stepA val nat applyA nfA ea a) <->
  (forall x, length x = length y -> domW x = true -> validW x = true ->
     stepW nfA nfB k (stepW nfA nfB k x) = stepW nfA nfB k x).
Proof.
  intros Hk Dy Vy. split.
  - intros H x Lx Dx Vx. destruct (split_valid_parts x Vx) as [VA VB]. destruct (domW_parts x Dx) as [DA DB].
    apply split_inj. rewrite !rules_dom_step_split by (auto using dom_stepW).
    rewrite Hk, !pstep_inl. unfold split. cbn [fst snd]. rewrite H; auto; [|rewrite <- Lx; apply keep_side_A].
    rewrite !(nfB_fix (keep inB x)) by auto. reflexivity.
  - intros H a Sa Da Va. destruct (complete_A a y Sa) as [Ez Lz].
    assert (Dz : domW (merge a (keep inB y)) = true) by (apply (domW_split _ _ _ Ez); auto; apply domW_parts, Dy).
    assert (Vz : validW (merge a (keep inB y)) = true).
    { rewrite rules_valid_split, Ez. unfold pvalid, Compose.valid. cbn [fst snd]. rewrite Va.
      apply split_valid_parts, Vy. }
    specialize (H _ Lz Dz Vz). apply (f_equal split) in H. rewrite !rules_dom_step_split in H by (auto using dom_stepW).
    rewrite Hk, Ez, !pstep_inl in H. cbn [fst snd] in H. injection H as H. exact H.
Qed.

(** The same for an event of the other components (side B). *)
Theorem rules_idem_iff_B k eb y : to_pe k = inr eb -> domW y = true -> validW y = true ->
  (forall b, side_state inB (length y) b -> domB b = true -> validB b = true ->
     stepB val nat applyB nfB eb (stepB val nat applyB nfB eb b) = stepB val nat applyB nfB eb b) <->
  (forall x, length x = length y -> domW x = true -> validW x = true ->
     stepW nfA nfB k (stepW nfA nfB k x) = stepW nfA nfB k x).
Proof.
  intros Hk Dy Vy. split.
  - intros H x Lx Dx Vx. destruct (split_valid_parts x Vx) as [VA VB]. destruct (domW_parts x Dx) as [DA DB].
    apply split_inj. rewrite !rules_dom_step_split by (auto using dom_stepW).
    rewrite Hk, !pstep_inr. unfold split. cbn [fst snd]. rewrite H; auto; [|rewrite <- Lx; apply keep_side_B].
    rewrite !(nfA_fix (keep inA x)) by auto. reflexivity.
  - intros H b Sb Db Vb. destruct (complete_B b y Sb) as [Ez Lz].
    assert (Dz : domW (merge (keep inA y) b) = true) by (apply (domW_split _ _ _ Ez); auto; apply domW_parts, Dy).
    assert (Vz : validW (merge (keep inA y) b) = true).
    { rewrite rules_valid_split, Ez. unfold pvalid, Compose.valid. cbn [fst snd]. rewrite Vb, andb_true_r.
      apply split_valid_parts, Vy. }
    specialize (H _ Lz Dz Vz). apply (f_equal split) in H. rewrite !rules_dom_step_split in H by (auto using dom_stepW).
    rewrite Hk, Ez, !pstep_inr in H. cbn [fst snd] in H. injection H as _ H. exact H.
Qed.

End Domain.

End Split.

(** ** 8. Many components, one at a time

    What Governance.v needs of a rules machine on a domain, as one proposition: the domain is
    closed under repair and events ([closed]), and there are a normal form and a potential with
    WFC, the repair loop reaching the normal form, CC1 for the declared independence and CC2
    ([governed]).  Splitting off one component preserves both ([rules_split_governed]); so a
    machine that passes the decomposition check, whose labels are all in a list of components
    each of which is governed on its domain, is governed on the nested domain with the nested
    independence (pairs inside a component: as that component declares; pairs across
    components: always) ([rules_components_governed]); and a governed machine converges
    ([governed_terminating], [governed_unique_normal_forms]). *)

Definition closed (invs evs : list rule) (dom : val -> bool) : Prop :=
  (forall x, dom x = true -> dom (rrepair invs x) = true) /\
  (forall k x, dom x = true -> dom (revent evs k x) = true).

Definition governed (invs evs : list rule) (dom : val -> bool) (indep : nat -> nat -> Prop) : Prop :=
  exists (nf : val -> val) (phi : val -> nat),
    (forall x, dom x = true -> rvalid invs x = false -> phi (rrepair invs x) < phi x) /\
    (forall x, dom x = true -> comp_path val (rvalid invs) (rrepair invs) x (nf x)) /\
    (forall k l x, indep k l -> dom x = true -> rvalid invs x = true ->
       nf (revent evs l (nf (revent evs k x))) = nf (revent evs k (nf (revent evs l x)))) /\
    (forall k x, dom x = true -> nf (revent evs k x) = nf (revent evs k (nf x))).

(** Splitting off one component: if component [c] and the rest are each closed and governed on
    their domains, so is the whole machine, on the domain of states whose projections are. *)
Theorem rules_split_governed lab c invs inv_lab evs ev_lab domA domB indepA indepB :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  closed (invsA c invs inv_lab) (evsA c evs ev_lab) domA ->
  governed (invsA c invs inv_lab) (evsA c evs ev_lab) domA indepA ->
  closed (invsB c invs inv_lab) (evsB c evs ev_lab) domB ->
  governed (invsB c invs inv_lab) (evsB c evs ev_lab) domB indepB ->
  closed invs evs (domW lab c domA domB) /\ governed invs evs (domW lab c domA domB) (indepW c ev_lab indepA indepB).
Proof.
  intros H [RA AA] (nfA & phiA & WA & PA & CA & DA) [RB AB] (nfB & phiB & WB & PB & CB & DB).
  split; [split|].
  - exact (rules_dom_rho lab c invs inv_lab evs ev_lab H domA domB RA RB).
  - exact (rules_dom_apply lab c invs inv_lab evs ev_lab H domA domB AA AB).
  - exists (nfW lab c nfA nfB), (fun x => phiA (keep (inA lab c) x) + phiB (keep (inB lab c) x)).
    split; [|split; [|split]].
    + exact (rules_dom_wfc lab c invs inv_lab evs ev_lab H domA domB RA RB phiA phiB WA WB).
    + exact (rules_dom_nf_path lab c invs inv_lab evs ev_lab H domA domB RA RB nfA nfB phiA phiB WA WB PA PB).
    + exact (rules_dom_cc1 lab c invs inv_lab evs ev_lab H domA domB RA AA RB AB nfA nfB phiA phiB indepA indepB
               WA WB PA PB CA CB).
    + exact (rules_dom_cc2 lab c invs inv_lab evs ev_lab H domA domB RA AA RB AB nfA nfB phiA phiB
               WA WB PA PB DA DB).
Qed.

(** The machine without rules: every state valid, no event changes anything. *)
Lemma revent_nil k x : revent [] k x = x.
Proof. unfold revent. destruct k; reflexivity. Qed.

Lemma empty_governed dom indep : closed [] [] dom /\ governed [] [] dom indep.
Proof.
  split; [split; intros; rewrite ?revent_nil; auto|].
  exists (fun x => x), (fun _ => 0). split; [|split; [|split]].
  - intros x _ V. discriminate.
  - intros x _. apply cp_done. reflexivity.
  - intros k l x _ _ _. rewrite !revent_nil. reflexivity.
  - intros k x _. reflexivity.
Qed.

Lemma in_keep_labels f rs ls l : In l (keep_labels f rs ls) -> In l ls /\ f l = true.
Proof.
  revert ls. induction rs as [|r rt IH]; intros [|m mt]; simpl; try tauto.
  destruct (f m) eqn:E; simpl.
  - intros [<-|H]; [auto|]. destruct (IH mt H). auto.
  - intros H. destruct (IH mt H). auto.
Qed.

Lemma keep_rules_nested f g rs ls : (forall l, f l = true -> g l = true) ->
  keep_rules f (keep_rules g rs ls) (keep_labels g rs ls) = keep_rules f rs ls.
Proof.
  intros Hfg. revert ls. induction rs as [|r rt IH]; intros [|m mt]; simpl; auto.
  destruct (g m) eqn:G; simpl.
  - destruct (f m); rewrite IH; auto.
  - destruct (f m) eqn:F; [rewrite Hfg in G by auto; discriminate|auto].
Qed.

Lemma keep_rules_none f g rs ls : (forall l, f l = true -> g l = false) ->
  keep_rules f (keep_rules g rs ls) (keep_labels g rs ls) = [].
Proof.
  intros Hfg. revert ls. induction rs as [|r rt IH]; intros [|m mt]; simpl; auto.
  destruct (g m) eqn:G; simpl; auto.
  destruct (f m) eqn:F; [rewrite Hfg in G by auto; discriminate|auto].
Qed.

(** The nested domain and independence of a list of components (the first split off first). *)
Fixpoint dom_all (lab : list nat) (cs : list nat) (doms : nat -> val -> bool) : val -> bool :=
  match cs with
  | [] => fun _ => true
  | c :: cs' => domW lab c (doms c) (dom_all lab cs' doms)
  end.

Fixpoint indep_all (cs : list nat) (evs : list rule) (ev_lab : list nat) (indeps : nat -> nat -> nat -> Prop)
    : nat -> nat -> Prop :=
  match cs with
  | [] => fun _ _ => True
  | c :: cs' => indepW c ev_lab (indeps c)
                  (indep_all cs' (keep_rules (isB c) evs ev_lab) (keep_labels (isB c) evs ev_lab) indeps)
  end.

(** A machine that passes the decomposition check, whose every label is one of the components
    [cs], each closed and governed on its domain [doms c] with its independence [indeps c] (over
    its own event numbering), is closed and governed on the nested domain. *)
Theorem rules_components_governed lab doms indeps : forall cs invs inv_lab evs ev_lab,
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  (forall l, In l inv_lab \/ In l ev_lab -> In l cs) ->
  (forall c, In c cs ->
     closed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (doms c)
     /\ governed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (doms c) (indeps c)) ->
  closed invs evs (dom_all lab cs doms) /\ governed invs evs (dom_all lab cs doms) (indep_all cs evs ev_lab indeps).
Proof.
  induction cs as [|c cs IH]; intros invs inv_lab evs ev_lab H Hl Hc.
  - assert (Li : inv_lab = []) by (destruct inv_lab as [|l lt]; auto; destruct (Hl l); simpl; auto).
    assert (Le : ev_lab = []) by (destruct ev_lab as [|l lt]; auto; destruct (Hl l); simpl; auto).
    unfold check_decomposition in H. apply andb_prop in H as [HI HE].
    apply rules_in_len in HI. apply rules_in_len in HE. subst.
    destruct invs; [|discriminate]. destruct evs; [|discriminate]. apply empty_governed.
  - destruct (Hc c (or_introl eq_refl)) as [CA GA].
    destruct (IH (keep_rules (isB c) invs inv_lab) (keep_labels (isB c) invs inv_lab)
                 (keep_rules (isB c) evs ev_lab) (keep_labels (isB c) evs ev_lab)) as [CB GB].
    + apply check_decomposition_rest, H.
    + intros l [Hi|Hi]; apply in_keep_labels in Hi as [Hi Hb];
        (destruct (Hl l) as [E|E]; [auto|subst; unfold isB in Hb; rewrite Nat.eqb_refl in Hb; discriminate|auto]).
    + intros c' Hc'. destruct (Nat.eq_dec c' c) as [->|Ne].
      * rewrite !keep_rules_none; [apply empty_governed| |];
          intros l E; unfold isA, isB in *; rewrite E; reflexivity.
      * rewrite !keep_rules_nested; [apply Hc; simpl; auto| |];
          intros l E; unfold isA, isB in *; apply Nat.eqb_eq in E; subst; apply Nat.eqb_neq in Ne; rewrite Ne; reflexivity.
    + exact (rules_split_governed lab c invs inv_lab evs ev_lab (doms c) (dom_all lab cs doms) (indeps c)
               (indep_all cs (keep_rules (isB c) evs ev_lab) (keep_labels (isB c) evs ev_lab) indeps) H CA GA CB GB).
Qed.

(** A governed machine converges on its domain (Governance.v): the rewrite system on its states
    terminates, and every run that ends with an empty bag in a valid state ends in the same one. *)
Section Governed.
Variables (invs evs : list rule) (dom : val -> bool) (indep : nat -> nat -> Prop).
Hypothesis Hc : closed invs evs dom.

Definition g_valid : D val dom -> bool := d_valid val dom (rvalid invs).
Definition g_rho : D val dom -> D val dom := d_rho val dom (rrepair invs) (proj1 Hc).
Definition g_apply : nat -> D val dom -> D val dom := d_apply val nat dom (revent evs) (proj2 Hc).

(** Every run of the rewrite system on the domain's states terminates ... *)
Theorem governed_terminating : governed invs evs dom indep ->
  forall cf, SN (G (D val dom) nat Nat.eq_dec g_valid g_rho g_apply indep) cf.
Proof.
  intros (nf & phi & W & _). apply gov_terminating.
  exists (fun s => phi (proj1_sig s)). intros s V. apply W; [apply proj2_sig|exact V].
Qed.

(** ... and all runs from one configuration that end (empty bag, valid state) end in the same state. *)
Theorem governed_unique_normal_forms : governed invs evs dom indep -> forall cf s1 s2,
  star (G (D val dom) nat Nat.eq_dec g_valid g_rho g_apply indep) cf (s1, []) ->
  star (G (D val dom) nat Nat.eq_dec g_valid g_rho g_apply indep) cf (s2, []) ->
  g_valid s1 = true -> g_valid s2 = true -> s1 = s2.
Proof.
  intros (nf & phi & W & P & C1 & C2).
  apply (gov_unique_normal_forms (D val dom) nat Nat.eq_dec g_valid g_rho g_apply indep
           (d_nf val dom (rvalid invs) (rrepair invs) nf (proj1 Hc) P)).
  - exists (fun s => phi (proj1_sig s)). intros s V. apply W; [apply proj2_sig|exact V].
  - apply d_path.
  - intros a b s I V. apply sig_bool_eq. apply C1; auto. apply proj2_sig.
  - intros e s. apply sig_bool_eq. apply C2, proj2_sig.
Qed.

End Governed.

(** ** 9. State ids are valuations

    Tables, and the rules checker of Rules.v, number a machine's states by mixed-radix ids:
    [decode vars s i] is the value of variable [i] at id [s].  Here: ids below [nstates vars]
    and valuations with every variable in its range correspond one to one ([val_of_range],
    [val_of_inj], [val_of_onto]), and the rules checker's meaning on ids is the rules machine
    of this file on valuations: validity ([valid_spec_val]), the repair step
    ([repair_spec_val]) and events ([apply_spec_val]), for assignments that set each variable
    at most once (the front end builds them from a mapping) and stay in the domains (which the
    checker verifies).  So when [check_rules] answers "match", every table entry is the rules
    machine's own step on the valuation the id stands for ([check_rules_valuations]). *)

(** The value of variable i at id s, walking the variables: digit 0 is s mod size_0, the rest
    is the id s / size_0 of the remaining variables. *)
Fixpoint dec (vars : list (Z * nat)) (s : nat) (i : nat) : Z :=
  match vars, i with
  | (lo, size) :: _, 0 => (lo + Z.of_nat (s mod size))%Z
  | (_, size) :: t, S i => dec t (s / size) i
  | [], _ => 0%Z
  end.

Lemma decode_dec_gen vars st s i :
  match nth_error (layout vars st) i with
  | Some (lo, size, stride) => (lo + Z.of_nat ((s / stride) mod size))%Z
  | None => 0%Z
  end = dec vars (s / st) i.
Proof.
  revert st s i. induction vars as [|[lo size] t IH]; intros st s [|i]; simpl; auto.
  rewrite IH. f_equal.
  destruct (Nat.eq_dec st 0) as [->|Hst]; [destruct size; reflexivity|].
  destruct (Nat.eq_dec size 0) as [->|Hsz]; [rewrite Nat.mul_0_r; reflexivity|].
  rewrite Nat.div_div; auto.
Qed.

Lemma decode_dec vars s i : decode vars s i = dec vars s i.
Proof. unfold decode. rewrite decode_dec_gen, Nat.div_1_r. reflexivity. Qed.

(** The id of a valuation: digit 0 plus size_0 times the id of the rest. *)
Fixpoint idx (vars : list (Z * nat)) (x : nat -> Z) : Z :=
  match vars with
  | [] => 0%Z
  | (lo, size) :: t => (x O - lo + Z.of_nat size * idx t (fun i => x (S i)))%Z
  end.

Fixpoint in_range (vars : list (Z * nat)) (x : nat -> Z) : Prop :=
  match vars with
  | [] => True
  | (lo, size) :: t => (lo <= x O < lo + Z.of_nat size)%Z /\ in_range t (fun i => x (S i))
  end.

Lemma nstates_aux_mul vars acc : nstates_aux vars acc = acc * nstates vars.
Proof.
  unfold nstates. revert acc. induction vars as [|[lo size] t IH]; intros acc; simpl; [lia|].
  rewrite IH, (IH (size + 0)). lia.
Qed.

Lemma nstates_cons lo size t : nstates ((lo, size) :: t) = size * nstates t.
Proof. unfold nstates at 1. simpl. rewrite nstates_aux_mul. lia. Qed.

Lemma idx_ext vars x y : (forall i, x i = y i) -> idx vars x = idx vars y.
Proof.
  revert x y. induction vars as [|[lo size] t IH]; intros x y H; simpl; auto.
  rewrite H, (IH (fun i => x (S i)) (fun i => y (S i))); auto.
Qed.

Lemma in_range_ext vars x y : (forall i, x i = y i) -> in_range vars x -> in_range vars y.
Proof.
  revert x y. induction vars as [|[lo size] t IH]; intros x y H; simpl; auto.
  intros [A B]. rewrite <- H. split; auto. apply (IH (fun i => x (S i))); auto.
Qed.

(** Ids below the number of states decode to valuations in range, whose id is the id again. *)
Lemma dec_in_range vars s : s < nstates vars -> in_range vars (dec vars s).
Proof.
  revert s. induction vars as [|[lo size] t IH]; intros s Hs; simpl; auto.
  rewrite nstates_cons in Hs. assert (size <> 0) by (intro; subst; simpl in Hs; lia).
  split.
  - pose proof (Nat.mod_upper_bound s size H). lia.
  - apply IH. apply Nat.div_lt_upper_bound; lia.
Qed.

Lemma idx_dec vars s : s < nstates vars -> idx vars (dec vars s) = Z.of_nat s.
Proof.
  revert s. induction vars as [|[lo size] t IH]; intros s Hs; simpl.
  - unfold nstates in Hs. simpl in Hs. lia.
  - rewrite nstates_cons in Hs. assert (size <> 0) by (intro; subst; simpl in Hs; lia).
    rewrite IH by (apply Nat.div_lt_upper_bound; lia).
    pose proof (Nat.div_mod s size H). lia.
Qed.

(** Valuations in range have an id below the number of states, which decodes to them. *)
Lemma idx_range vars x : in_range vars x -> (0 <= idx vars x < Z.of_nat (nstates vars))%Z.
Proof.
  revert x. induction vars as [|[lo size] t IH]; intros x Hx; simpl.
  - unfold nstates. simpl. lia.
  - destruct Hx as [A B]. specialize (IH _ B). rewrite nstates_cons, Nat2Z.inj_mul.
    set (R := idx t (fun i => x (S i))) in *. set (N := Z.of_nat (nstates t)) in *.
    assert (P0 : (0 <= Z.of_nat size * R)%Z) by (apply Z.mul_nonneg_nonneg; lia).
    assert (P1 : (Z.of_nat size * R + Z.of_nat size <= Z.of_nat size * N)%Z).
    { rewrite <- Z.mul_succ_r. apply Z.mul_le_mono_nonneg_l; lia. }
    lia.
Qed.

Lemma dec_idx vars x i : in_range vars x -> i < length vars -> dec vars (Z.to_nat (idx vars x)) i = x i.
Proof.
  revert x i. induction vars as [|[lo size] t IH]; intros x i Hx Hi; simpl in *; [lia|].
  destruct Hx as [A B]. pose proof (idx_range t _ B) as R.
  set (d := Z.to_nat (x O - lo)). set (r := Z.to_nat (idx t (fun i => x (S i)))).
  assert (E : Z.to_nat (x O - lo + Z.of_nat size * idx t (fun i => x (S i))) = d + size * r).
  { unfold d, r. lia. }
  assert (Hd : d < size) by (unfold d; lia).
  rewrite E. destruct i as [|i].
  - rewrite (Nat.mul_comm size r), Nat.mod_add by lia. rewrite Nat.mod_small by auto. unfold d. lia.
  - rewrite (Nat.mul_comm size r), Nat.div_add by lia. rewrite Nat.div_small by auto. simpl.
    apply (IH (fun i => x (S i))); auto. lia.
Qed.

Definition upd_fn (x : nat -> Z) (i : nat) (v : Z) (j : nat) : Z := if Nat.eqb j i then v else x j.

Lemma idx_upd_gen vars : forall st x i lo size stride v, nth_error (layout vars st) i = Some (lo, size, stride) ->
  (Z.of_nat st * idx vars (upd_fn x i v) = Z.of_nat st * idx vars x + (v - x i) * Z.of_nat stride)%Z.
Proof.
  induction vars as [|[lo0 size0] t IH]; intros st x [|i] lo size stride v H; simpl in H; try discriminate.
  - injection H as <- <- <-. simpl. unfold upd_fn at 1. simpl.
    rewrite (idx_ext t (fun j => upd_fn x 0 v (S j)) (fun j => x (S j))) by reflexivity. ring.
  - simpl. unfold upd_fn at 1. simpl.
    rewrite (idx_ext t (fun j => upd_fn x (S i) v (S j)) (upd_fn (fun j => x (S j)) i v)) by reflexivity.
    pose proof (IH (st * size0) (fun j => x (S j)) i lo size stride v H) as E. rewrite Nat2Z.inj_mul in E.
    simpl in E. rewrite !Z.mul_add_distr_l, !Z.mul_assoc, E. ring.
Qed.

Lemma idx_upd vars x i lo size stride v : nth_error (layout vars 1) i = Some (lo, size, stride) ->
  idx vars (upd_fn x i v) = (idx vars x + (v - x i) * Z.of_nat stride)%Z.
Proof.
  intros H. pose proof (idx_upd_gen vars 1 x i lo size stride v H) as E. change (Z.of_nat 1) with 1%Z in E.
  rewrite !Z.mul_1_l in E. exact E.
Qed.

Lemma in_range_upd_gen vars : forall st x i lo size stride v, nth_error (layout vars st) i = Some (lo, size, stride) ->
  in_range vars x -> (lo <= v < lo + Z.of_nat size)%Z -> in_range vars (upd_fn x i v).
Proof.
  induction vars as [|[lo0 size0] t IH]; intros st x [|i] lo size stride v H Hx Hv; simpl in H; try discriminate;
    destruct Hx as [A B].
  - injection H as <- <- <-. split; [exact Hv|]. apply (in_range_ext t (fun j => x (S j))); auto.
  - split; [exact A|]. apply (in_range_ext t (upd_fn (fun j => x (S j)) i v)); [reflexivity|].
    apply (IH (st * size0) _ i lo size stride v H B Hv).
Qed.

Lemma enc_spec_false x lay asg acc : snd (enc_spec x lay asg acc false) = false.
Proof.
  revert acc. induction asg as [|[i e] t IH]; intros acc; simpl; auto.
  destruct (nth_error lay i) as [[[lo size] st]|]; apply IH.
Qed.

Lemma assign_fn_notin x asg i : ~ In i (map fst asg) -> assign_fn x asg i = x i.
Proof.
  induction asg as [|[j e] t IH]; simpl; auto. intros H.
  destruct (Nat.eqb i j) eqn:E; [apply Nat.eqb_eq in E; subst; tauto|auto].
Qed.

Lemma assign_fn_cons x i e t j : assign_fn x ((i, e) :: t) j = upd_fn (assign_fn x t) i (eval x e) j.
Proof. reflexivity. Qed.

(** An assignment that sets each variable at most once and stays in range: the id enc_spec
    computes is the id of the assigned valuation, and that valuation is in range. *)
Lemma enc_spec_idx vars x asg : forall acc ok, NoDup (map fst asg) ->
  snd (enc_spec x (layout vars 1) asg acc ok) = true ->
  ok = true /\ fst (enc_spec x (layout vars 1) asg acc ok) = (acc + idx vars (assign_fn x asg) - idx vars x)%Z
  /\ (in_range vars x -> in_range vars (assign_fn x asg)).
Proof.
  induction asg as [|[i e] t IH]; intros acc ok Hd H; cbn [enc_spec map fst] in H, Hd |- *.
  - split; [exact H|split; [|intros Hx; apply (in_range_ext vars x); auto]].
    rewrite (idx_ext vars _ x) by reflexivity. lia.
  - inversion Hd as [|? ? Hni Hd']; subst.
    destruct (nth_error (layout vars 1) i) as [[[lo size] st]|] eqn:Hl; [|rewrite enc_spec_false in H; discriminate].
    destruct (IH _ _ Hd' H) as (Hok & Hf & Hr).
    apply andb_prop in Hok as [Hok Hhi]. apply andb_prop in Hok as [Hok Hlo].
    apply Z.leb_le in Hlo. apply Z.ltb_lt in Hhi.
    split; [exact Hok|split].
    + rewrite Hf. rewrite (idx_ext vars (assign_fn x ((i, e) :: t)) (upd_fn (assign_fn x t) i (eval x e))) by reflexivity.
      rewrite (idx_upd vars (assign_fn x t) i lo size st (eval x e) Hl).
      rewrite (assign_fn_notin x t i Hni). lia.
    + intros Hx. apply (in_range_ext vars (upd_fn (assign_fn x t) i (eval x e))); [reflexivity|].
      apply (in_range_upd_gen vars 1 _ i lo size st); auto.
Qed.

Lemma length_layout vars st : length (layout vars st) = length vars.
Proof. revert st. induction vars as [|[lo size] t IH]; intros st; simpl; auto. Qed.

Lemma decode_out vars s i : length vars <= i -> decode vars s i = 0%Z.
Proof. intros H. unfold decode. rewrite (proj2 (nth_error_None _ _)) by (rewrite length_layout; auto). reflexivity. Qed.

Lemma eval_ext x y e : (forall j, x j = y j) -> eval x e = eval y e.
Proof. intros H. induction e; simpl; try rewrite IHe1, IHe2; try rewrite IHe3; try rewrite IHe; auto. Qed.

Lemma assign_fn_ext x y asg i : (forall j, x j = y j) -> assign_fn x asg i = assign_fn y asg i.
Proof.
  intros H. induction asg as [|[j e] t IH]; simpl; auto. destruct (Nat.eqb i j); auto. apply eval_ext, H.
Qed.

(** The valuation a state id stands for. *)
Definition val_of (vars : list (Z * nat)) (s : nat) : val := map (decode vars s) (seq 0 (length vars)).

Lemma length_val_of vars s : length (val_of vars s) = length vars.
Proof. unfold val_of. rewrite map_length, seq_length. reflexivity. Qed.

Lemma get_val_of vars s i : get (val_of vars s) i = decode vars s i.
Proof.
  destruct (Nat.lt_ge_cases i (length vars)) as [H|H].
  - unfold get, val_of. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto).
    rewrite seq_nth by auto. reflexivity.
  - rewrite get_out by (rewrite length_val_of; auto). symmetry. apply decode_out, H.
Qed.

Lemma holds_val_of vars s e : holds (val_of vars s) e = nz (eval (decode vars s) e).
Proof. unfold holds. rewrite (eval_ext _ (decode vars s)); auto. intros j. apply get_val_of. Qed.

Lemma assign_spec_val vars asg s : s < nstates vars -> NoDup (map fst asg) ->
  snd (assign_spec vars (decode vars s) asg s) = true ->
  val_of vars (fst (assign_spec vars (decode vars s) asg s)) = upd (val_of vars s) asg.
Proof.
  intros Hs Hd Hok. unfold assign_spec in *. cbn [fst snd] in *.
  destruct (enc_spec_idx vars (decode vars s) asg (Z.of_nat s) true Hd Hok) as (_ & Hf & Hr).
  rewrite Hf.
  assert (Ex : forall j, decode vars s j = dec vars s j) by (intros; apply decode_dec).
  rewrite (idx_ext vars (decode vars s) (dec vars s) Ex), idx_dec by auto.
  replace (Z.of_nat s + idx vars (assign_fn (decode vars s) asg) - Z.of_nat s)%Z
    with (idx vars (assign_fn (decode vars s) asg)) by lia.
  assert (R : in_range vars (assign_fn (decode vars s) asg)).
  { apply Hr. apply (in_range_ext vars (dec vars s)); [intros; symmetry; apply decode_dec|apply dec_in_range; auto]. }
  apply val_ext; [rewrite length_upd, !length_val_of; auto|].
  intros i Hi. rewrite length_val_of in Hi.
  rewrite get_val_of, decode_dec, dec_idx by auto.
  rewrite get_upd by (rewrite length_val_of; auto).
  apply assign_fn_ext. intros j. symmetry. apply get_val_of.
Qed.

(** Validity at an id is validity of its valuation. *)
Theorem valid_spec_val vars invs s : valid_spec vars invs s = rvalid invs (val_of vars s).
Proof.
  unfold valid_spec, rvalid. induction invs as [|r t IH]; simpl; auto. rewrite IH, holds_val_of. reflexivity.
Qed.

(** The repair entry at an id (staying in the domains, assignments setting each variable at
    most once) is the id of the repaired valuation. *)
Theorem repair_spec_val vars invs s : s < nstates vars -> (forall r, In r invs -> NoDup (map fst (snd r))) ->
  snd (repair_spec vars invs s) = true -> val_of vars (fst (repair_spec vars invs s)) = rrepair invs (val_of vars s).
Proof.
  intros Hs. induction invs as [|[h asg] t IH]; intros Hd Hok; cbn [repair_spec rrepair fst snd] in *; auto.
  rewrite holds_val_of. revert Hok. destruct (nz (eval (decode vars s) h)); intros Hok.
  - apply IH; auto. intros r Hr. apply Hd. simpl. auto.
  - apply assign_spec_val; auto. apply (Hd (h, asg)). simpl. auto.
Qed.

(** An event's entry at an id is the id of the valuation after the event. *)
Theorem apply_spec_val vars (r : expr * assignment) s : s < nstates vars -> NoDup (map fst (snd r)) ->
  snd (apply_spec vars r s) = true -> val_of vars (fst (apply_spec vars r s)) = rapply r (val_of vars s).
Proof.
  intros Hs Hd Hok. unfold apply_spec, rapply in *. rewrite holds_val_of. revert Hok.
  destruct (nz (eval (decode vars s) (fst r))); intros Hok; auto. apply assign_spec_val; auto.
Qed.

(** Ids below the number of states and valuations in range correspond one to one: an id stands
    for a valuation in range ... *)
Theorem val_of_range vars s : s < nstates vars -> in_range vars (get (val_of vars s)).
Proof.
  intros Hs. apply (in_range_ext vars (dec vars s)); [|apply dec_in_range; auto].
  intros i. rewrite get_val_of, decode_dec. reflexivity.
Qed.

(** Distinct ids stand for distinct valuations ... *)
Theorem val_of_inj vars s s' : s < nstates vars -> s' < nstates vars -> val_of vars s = val_of vars s' -> s = s'.
Proof.
  intros Hs Hs' E. apply Nat2Z.inj. rewrite <- (idx_dec vars s Hs), <- (idx_dec vars s' Hs').
  apply idx_ext. intros i. rewrite <- !decode_dec, <- !get_val_of, E. reflexivity.
Qed.

(** ... and every valuation in range is the valuation of some id below the number of states. *)
Theorem val_of_onto vars x : length x = length vars -> in_range vars (get x) ->
  exists s, s < nstates vars /\ val_of vars s = x.
Proof.
  intros Hl Hr. pose proof (idx_range vars _ Hr) as R.
  exists (Z.to_nat (idx vars (get x))). split; [lia|].
  apply val_ext; [rewrite length_val_of; auto|]. intros i Hi. rewrite length_val_of in Hi.
  rewrite get_val_of, decode_dec, dec_idx; auto.
Qed.

(** With the rules checker's answer "match": at every id, the tables are the valid test, the
    repair and the events of the rules machine on the valuation the id stands for. *)
Theorem check_rules_valuations vars invs evs valid repair apply :
  check_rules vars invs evs valid repair apply = None ->
  (forall r, In r invs \/ In r evs -> NoDup (map fst (snd r))) ->
  forall s, s < nstates vars ->
    mnth valid s = rvalid invs (val_of vars s)
    /\ val_of vars (vnth repair s) = rrepair invs (val_of vars s)
    /\ forall e, e < length evs -> val_of vars (vnth (nth e apply dflt) s) = revent evs e (val_of vars s).
Proof.
  intros H Hd s Hs. destruct (check_rules_sound vars invs evs valid repair apply H) as (_ & _ & _ & All).
  destruct (All s Hs) as (V & R & Rok & E).
  split; [rewrite V; apply valid_spec_val|split].
  - rewrite R. apply repair_spec_val; auto.
  - intros e He. destruct (E e He) as [E1 E2]. rewrite E1. unfold revent.
    replace (nth e evs noev) with (nth e evs (ELit 0, [])) by reflexivity.
    apply apply_spec_val; auto. apply Hd. right. apply nth_In, He.
Qed.
