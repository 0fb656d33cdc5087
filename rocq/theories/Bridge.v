(** * From a certified table verdict to the convergence theorem.

    When [check_tables] certifies a machine with domain "valid" and reports CC2, the machine its
    tables define satisfies every hypothesis of the governance rewrite system (Governance.v):
    WFC, a normal-form function reached by compensation, CC1 for the checked pairs on valid
    states, and CC2.  So the full system on (state, bag of pending events), with apply and
    compensation steps in any interleaving, terminates and is confluent, and every delivery
    order of the same pairwise-independent events reaches the same valid state.

    States are the naturals; ids at or beyond the number of states are sent to the initial
    state by compensation (they never occur in the tables, this only makes the functions total). *)

From Coq Require Import List Arith Bool Lia Permutation.
From Govern Require Import Vec TableCheck Newman Governance.
Import ListNotations.

Section Bridge.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).

Definition bv : verdict := check_tables valid repair apply pairs false init.

Definition t_valid (s : nat) : bool := Nat.ltb s (mlen valid) && mnth valid s.
Definition t_rho (s : nat) : nat := if Nat.ltb s (mlen valid) then rep repair s else init.
Definition t_apply (e s : nat) : nat := app apply e (if Nat.ltb s (mlen valid) then s else init).
Definition t_nf (s : nat) : nat := vnth (v_nf bv) (if Nat.ltb s (mlen valid) then s else init).
Definition t_indep (a b : nat) : Prop :=
  checked pairs (nevents apply) a b \/ checked pairs (nevents apply) b a.

Hypothesis Hcert : v_certified bv = true.
Hypothesis Hcc2 : v_cc2 bv = true.

Lemma bridge_facts :
  WFC valid repair /\ IsNF valid repair (v_nf bv) /\ mnth valid init = true /\ init < mlen valid
  /\ (forall a b, checked pairs (nevents apply) a b -> a < nevents apply /\ b < nevents apply)
  /\ (forall a b s, checked pairs (nevents apply) a b -> s < mlen valid -> mnth valid s = true ->
        nstep apply (v_nf bv) b (nstep apply (v_nf bv) a s) = nstep apply (v_nf bv) a (nstep apply (v_nf bv) b s))
  /\ CC2 valid apply (v_nf bv)
  /\ (forall e s, e < nevents apply -> s < mlen valid -> app apply e s < mlen valid).
Proof.
  destruct (check_tables_sound valid repair apply pairs false init Hcert)
    as (Hw & Hnf & Hi & dom & Hd & Hsub & Hval & _ & Hr & Hcc).
  assert (Hin : init < mlen valid) by (apply Hsub; auto).
  assert (Hc2 : CC2 valid apply (v_nf bv)).
  { apply (check_tables_cc2 valid repair apply pairs false init).
    - revert Hcert. unfold bv, check_tables, check_from_nf.
      destruct (well_formed _ _ _ _ _); simpl; [|discriminate].
      destruct (nf_result valid repair) as [[[|] F] D]; simpl; [|discriminate].
      repeat match goal with |- context [if ?c then _ else _] => destruct c end; simpl; auto.
    - exact Hcc2. }
  refine (conj Hw (conj Hnf (conj Hi (conj Hin (conj Hr (conj _ (conj Hc2 _))))))).
  - intros a b s H Hs Hv. apply Hcc; [auto|apply Hval; auto].
  - intros e s He Hs. unfold bv in Hcert. revert Hcert. unfold check_tables, check_from_nf.
    destruct (well_formed _ _ _ _ _) eqn:WF; simpl; [|discriminate]. intros _.
    apply (app_lt valid repair apply pairs init WF); auto.
Qed.

Lemma nf_lt' s : s < mlen valid -> vnth (v_nf bv) s < mlen valid.
Proof. destruct bridge_facts as (_ & Hnf & _). intros Hs. apply Hnf; auto. Qed.

Lemma nf_init : vnth (v_nf bv) init = init.
Proof.
  destruct bridge_facts as (_ & Hnf & Hi & Hin & _).
  symmetry. destruct (proj2 Hnf init Hin) as (_ & _ & _ & H). apply (H 0). exact Hi.
Qed.

Lemma t_wfc : exists phi : nat -> nat, forall s, t_valid s = false -> phi (t_rho s) < phi s.
Proof.
  destruct bridge_facts as ([phi Hphi] & Hnf & Hi & Hin & _).
  exists (fun s => if Nat.ltb s (mlen valid) then phi s + 1 else phi init + 2).
  intros s Hv. unfold t_valid, t_rho in *.
  destruct (Nat.ltb s (mlen valid)) eqn:Hs; simpl in Hv.
  - apply Nat.ltb_lt in Hs.
    assert (Hr : rep repair s < mlen valid).
    { unfold bv in Hcert. revert Hcert. unfold check_tables, check_from_nf.
      destruct (well_formed _ _ _ _ _) eqn:WF; simpl; [|discriminate]. intros _.
      apply (rep_lt valid repair apply pairs init WF); auto. }
    apply Nat.ltb_lt in Hr. rewrite Hr. specialize (Hphi s Hs Hv). lia.
  - apply Nat.ltb_lt in Hin. rewrite Hin. lia.
Qed.

Lemma iter_path k s : s < mlen valid -> mnth valid (iter repair k s) = true ->
  comp_path nat t_valid t_rho s (iter repair k s).
Proof.
  unfold bv in Hcert. revert Hcert. unfold check_tables, check_from_nf.
  destruct (well_formed _ _ _ _ _) eqn:WF; simpl; [|discriminate]. intros _.
  revert s. induction k as [|k IH]; intros s Hs Hv; simpl in *.
  - apply cp_done. unfold t_valid. apply Nat.ltb_lt in Hs. rewrite Hs, Hv. reflexivity.
  - destruct (mnth valid s) eqn:Vs.
    + rewrite (rep_valid valid repair apply pairs init WF s Hs Vs) in *. apply IH; auto.
    + apply cp_step.
      * unfold t_valid. rewrite Vs, andb_false_r. reflexivity.
      * unfold t_rho. apply Nat.ltb_lt in Hs as Hs'. rewrite Hs'.
        apply IH; auto. apply (rep_lt valid repair apply pairs init WF); auto.
Qed.

Lemma t_nf_path s : comp_path nat t_valid t_rho s (t_nf s).
Proof.
  destruct bridge_facts as (_ & Hnf & Hi & Hin & _).
  unfold t_nf. destruct (Nat.ltb s (mlen valid)) eqn:Hs.
  - apply Nat.ltb_lt in Hs. destruct (proj2 Hnf s Hs) as (_ & Hv & [k Hk] & _).
    rewrite Hk in *. apply iter_path; auto.
  - apply cp_step.
    + unfold t_valid. rewrite Hs. reflexivity.
    + unfold t_rho. rewrite Hs. rewrite nf_init. apply cp_done.
      unfold t_valid. apply Nat.ltb_lt in Hin. rewrite Hin, Hi. reflexivity.
Qed.

Lemma t_nf_in s : s < mlen valid -> t_nf s = vnth (v_nf bv) s.
Proof. intros Hs. unfold t_nf. apply Nat.ltb_lt in Hs. rewrite Hs. reflexivity. Qed.

Lemma t_step_in e s : e < nevents apply -> s < mlen valid ->
  step nat nat t_apply t_nf e s = nstep apply (v_nf bv) e s.
Proof.
  destruct bridge_facts as (_ & _ & _ & _ & _ & _ & _ & Happ).
  intros He Hs. unfold step, t_apply. apply Nat.ltb_lt in Hs as Hs'. rewrite Hs'.
  apply t_nf_in, Happ; auto.
Qed.

Lemma t_cc1 a b s : t_indep a b -> t_valid s = true ->
  step nat nat t_apply t_nf b (step nat nat t_apply t_nf a s) = step nat nat t_apply t_nf a (step nat nat t_apply t_nf b s).
Proof.
  destruct bridge_facts as (_ & _ & _ & _ & Hr & Hcc & _ & Happ).
  intros Hab Hv. unfold t_valid in Hv. apply andb_prop in Hv as [Hs Hv]. apply Nat.ltb_lt in Hs.
  assert (Hlt : forall e x, e < nevents apply -> x < mlen valid -> nstep apply (v_nf bv) e x < mlen valid).
  { intros e x He Hx. apply nf_lt', Happ; auto. }
  destruct Hab as [H|H]; destruct (Hr _ _ H) as [H1 H2].
  - rewrite (t_step_in a s), (t_step_in b s), t_step_in, t_step_in by auto. apply Hcc; auto.
  - rewrite (t_step_in a s), (t_step_in b s), t_step_in, t_step_in by auto. symmetry. apply Hcc; auto.
Qed.

Lemma t_cc2 e s : step nat nat t_apply t_nf e s = step nat nat t_apply t_nf e (t_nf s).
Proof.
  destruct bridge_facts as (_ & _ & Hi & Hin & _ & _ & Hc2 & Happ).
  unfold step, t_apply.
  destruct (Nat.ltb s (mlen valid)) eqn:Hs.
  - apply Nat.ltb_lt in Hs. rewrite (t_nf_in s) by auto.
    assert (Hn := nf_lt' s Hs). apply Nat.ltb_lt in Hn as Hn'. rewrite Hn'.
    destruct (Nat.lt_ge_cases e (nevents apply)) as [He|He].
    + rewrite !t_nf_in by (apply Happ; auto). apply Hc2; auto.
    + unfold app. rewrite !nth_overflow by auto.
      assert (Z0 : forall x, vnth dflt x = 0) by (intros [|x]; reflexivity). rewrite !Z0. reflexivity.
  - assert (E : t_nf s = init) by (unfold t_nf; rewrite Hs; apply nf_init).
    rewrite E. apply Nat.ltb_lt in Hin as Hin'. rewrite Hin'. reflexivity.
Qed.

(** The headline: a certified verdict with CC2 (domain "valid") gives stream convergence for the
    machine of the tables, from any state, with any interleaving of compensation. *)
Theorem check_tables_convergence : forall s b es1 es2,
  pw nat t_indep b -> Permutation es1 b -> Permutation es2 b ->
  fold_left (fun t e => step nat nat t_apply t_nf e t) es1 (t_nf s) = fold_left (fun t e => step nat nat t_apply t_nf e t) es2 (t_nf s)
  /\ (forall t, star (G nat nat Nat.eq_dec t_valid t_rho t_apply t_indep) (s, b) (t, []) -> t_valid t = true ->
        t = fold_left (fun t e => step nat nat t_apply t_nf e t) es1 (t_nf s)).
Proof.
  intros s b es1 es2 Hpw H1 H2.
  apply (stream_convergence nat nat Nat.eq_dec t_valid t_rho t_apply t_indep t_nf t_wfc t_nf_path t_cc1 t_cc2); auto.
Qed.

End Bridge.
