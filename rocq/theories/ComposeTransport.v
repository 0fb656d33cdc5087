(** * From each component's certificate to the whole rules machine governed.

    ComposeRules.v proves that a rules machine passing the extracted decomposition check is
    governed on the product of its components' domains when every component, as the projection
    keeping the whole machine's variable numbering, is governed on its domain
    ([rules_components_governed]).  This file supplies that hypothesis from what is actually
    checked per component, closing the two remaining steps:

    - transport ([governed_transport], section 1): a machine governed on a domain carries its
      facts (WFC, normal form reached by repair, CC1, CC2) to any rules machine that it
      simulates exactly through a map [F] with a section [G] on the domains;
    - table verdicts ([tables_governed], section 2): when the extracted [check_rules] answers
      "match" for rules and tables, and the extracted [check_tables] certifies the tables with
      domain "valid" and CC2, the rules machine is governed on the valuations in range (ids and
      valuations: ComposeRules.v section 9), with the independence the tables check;
    - renumbering ([renumber_governed], section 3): a component's machine numbers its own
      variables 0.. in the order of the list [vs] of its whole-machine variables; a rule is
      renumbered by [ren_rule (pos vs)].  The component machine governed on a domain makes the
      projection of ComposeRules.v (whole numbering, other variables at 0) governed on the
      states that are zero off the component and whose renumbering is in that domain;
    - the headline ([check_components_governed], section 4): the decomposition check, and per
      component "match" of its renumbered rules with its tables and a certified verdict with
      CC2, make the whole rules machine closed and governed on the nested domain, hence its
      rewrite system terminates and has unique normal forms ([check_components_converge]);
    - the whole domain (section 5): when the components are distinct and every variable belongs
      to one, that nested domain is, at the whole machine's length, every variable in its range
      ([dom_all_spec]), and the whole machine is closed and governed there
      ([check_components_governed_in_range]).

    Components certified with domain "reachable", or without CC2, are not covered here. *)

From Coq Require Import List Arith Bool Lia ZArith.
From Govern Require Import Vec ZVec TableCheck Rules Newman Governance Bridge Compose ComposeRules.
Import ListNotations.

(** ** 1. Governance along a simulation *)

Section Transport.
Variables (S : Type) (dom1 : S -> Prop) (valid1 : S -> bool) (rho1 : S -> S) (apply1 : nat -> S -> S)
  (nf1 : S -> S) (phi1 : S -> nat) (indep : nat -> nat -> Prop).
Hypothesis dom1_rho : forall s, dom1 s -> dom1 (rho1 s).
Hypothesis wfc1 : forall s, dom1 s -> valid1 s = false -> phi1 (rho1 s) < phi1 s.
Hypothesis path1 : forall s, dom1 s -> comp_path S valid1 rho1 s (nf1 s).
Hypothesis cc1_1 : forall k l s, indep k l -> dom1 s -> valid1 s = true ->
  nf1 (apply1 l (nf1 (apply1 k s))) = nf1 (apply1 k (nf1 (apply1 l s))).
Hypothesis cc2_1 : forall k s, dom1 s -> nf1 (apply1 k s) = nf1 (apply1 k (nf1 s)).

Variables (invs evs : list rule) (dom : val -> bool) (F : val -> S) (G : S -> val).
Hypothesis Hclosed : closed invs evs dom.
Hypothesis HF : forall x, dom x = true -> dom1 (F x) /\ G (F x) = x.
Hypothesis HG : forall s, dom1 s -> dom (G s) = true /\ F (G s) = s.
Hypothesis Hv : forall x, dom x = true -> rvalid invs x = valid1 (F x).
Hypothesis Hr : forall x, dom x = true -> F (rrepair invs x) = rho1 (F x).
Hypothesis Ha : forall k x, dom x = true -> F (revent evs k x) = apply1 k (F x).

Lemma dom1_path s t : comp_path S valid1 rho1 s t -> dom1 s -> dom1 t.
Proof. induction 1; auto. Qed.

Lemma transport_path : forall s t, comp_path S valid1 rho1 s t ->
  forall x, dom x = true -> F x = s -> comp_path val (rvalid invs) (rrepair invs) x (G t).
Proof.
  induction 1 as [s V|s t V P IH]; intros x D E.
  - destruct (HF x D) as [_ GF]. rewrite <- E, GF. apply cp_done. rewrite Hv, E; auto.
  - apply cp_step; [rewrite Hv, E; auto|]. apply IH; [apply (proj1 Hclosed); auto|]. rewrite Hr, E; auto.
Qed.

Theorem governed_transport : governed invs evs dom indep.
Proof.
  exists (fun x => G (nf1 (F x))), (fun x => phi1 (F x)). split; [|split; [|split]].
  - intros x D V. rewrite Hr by auto. apply wfc1; [apply HF; auto|]. rewrite <- Hv; auto.
  - intros x D. apply (transport_path (F x)); auto. apply path1, HF, D.
  - intros k l x I D V. destruct (HF x D) as [D1 _].
    assert (N : forall s, dom1 s -> dom1 (nf1 s)) by (intros s Ds; apply (dom1_path s); auto).
    assert (Ap : forall m y, dom y = true -> dom1 (F (revent evs m y))).
    { intros m y Dy. apply HF. apply (proj2 Hclosed); auto. }
    assert (Step : forall m y, dom y = true ->
              F (revent evs m (G (nf1 (F y)))) = apply1 m (nf1 (F y))).
    { intros m y Dy. destruct (HG (nf1 (F y))) as [DG FG]; [apply N, HF, Dy|].
      rewrite Ha, FG; auto. }
    rewrite !Step by (apply (proj2 Hclosed); auto). rewrite !Ha by auto.
    f_equal. apply cc1_1; auto. rewrite <- Hv; auto.
  - intros k x D. destruct (HG (nf1 (F x))) as [DG FG]; [apply (dom1_path (F x)); [apply path1|]; apply HF, D|].
    rewrite !Ha, FG by auto. f_equal. apply cc2_1, HF, D.
Qed.

End Transport.

(** ** 2. A certified table verdict governs the rules machine it matches *)

(** Every variable in its range, as a test. *)
Fixpoint in_rangeb (vars : list (Z * nat)) (x : nat -> Z) : bool :=
  match vars with
  | [] => true
  | (lo, size) :: t => (Z.leb lo (x O) && Z.ltb (x O) (lo + Z.of_nat size))%Z && in_rangeb t (fun i => x (S i))
  end.

Lemma in_rangeb_spec vars x : in_rangeb vars x = true <-> in_range vars x.
Proof.
  revert x. induction vars as [|[lo size] t IH]; intros x; simpl; [tauto|].
  rewrite !andb_true_iff, Z.leb_le, Z.ltb_lt, IH. tauto.
Qed.

(** The domain of a machine over [vars]: valuations of the right length, every variable in range. *)
Definition in_dom (vars : list (Z * nat)) (x : val) : bool :=
  Nat.eqb (length x) (length vars) && in_rangeb vars (get x).

(** The id of a valuation. *)
Definition id_of (vars : list (Z * nat)) (x : val) : nat := Z.to_nat (idx vars (get x)).

Lemma in_dom_id vars x : in_dom vars x = true -> id_of vars x < nstates vars /\ val_of vars (id_of vars x) = x.
Proof.
  unfold in_dom, id_of. intros H. apply andb_prop in H as [Hl Hr]. apply Nat.eqb_eq in Hl.
  apply in_rangeb_spec in Hr. pose proof (idx_range vars _ Hr) as R. split; [lia|].
  apply val_ext; [rewrite length_val_of; auto|]. intros i Hi. rewrite length_val_of in Hi.
  rewrite get_val_of, decode_dec, dec_idx; auto.
Qed.

Lemma id_in_dom vars s : s < nstates vars -> in_dom vars (val_of vars s) = true /\ id_of vars (val_of vars s) = s.
Proof.
  intros Hs. unfold in_dom, id_of. split.
  - rewrite length_val_of, Nat.eqb_refl. apply in_rangeb_spec, val_of_range, Hs.
  - rewrite (idx_ext vars _ (dec vars s)) by (intros i; rewrite get_val_of; apply decode_dec).
    rewrite idx_dec by auto. lia.
Qed.

Lemma revent_out evs k x : length evs <= k -> revent evs k x = x.
Proof. intros H. unfold revent. rewrite nth_overflow by auto. reflexivity. Qed.

Lemma path_valid {S : Type} (valid : S -> bool) (rho : S -> S) s t : comp_path S valid rho s t -> valid t = true.
Proof. induction 1; auto. Qed.

Lemma path_from_valid {S : Type} (valid : S -> bool) (rho : S -> S) s t : comp_path S valid rho s t -> valid s = true -> t = s.
Proof. intros P V. inversion P; subst; auto. congruence. Qed.

Section Tables.
Variables (vars : list (Z * nat)) (invs evs : list rule).
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).
Hypothesis Hrules : check_rules vars invs evs valid repair apply = None.
Hypothesis Hnodup : forall r, In r invs \/ In r evs -> NoDup (map fst (snd r)).
Hypothesis Hcert : v_certified (check_tables valid repair apply pairs false init) = true.
Hypothesis Hcc2 : v_cc2 (check_tables valid repair apply pairs false init) = true.

Let N := mlen valid.
Let M := length evs.

Lemma wf_of_cert : well_formed valid repair apply pairs init = true.
Proof.
  revert Hcert. unfold check_tables, check_from_nf. destruct (well_formed _ _ _ _ _); simpl; auto.
Qed.

Lemma sizes : N = nstates vars /\ nevents apply = M.
Proof. destruct (check_rules_sound vars invs evs valid repair apply Hrules) as (A & _ & B & _). split; auto. Qed.

Definition tb_apply (k s : nat) : nat := if Nat.ltb k M then t_apply valid apply init k s else s.

Lemma tables_closed : closed invs evs (in_dom vars).
Proof.
  destruct sizes as [EN EM]. destruct (bridge_facts valid repair apply pairs init Hcert Hcc2) as (_ & _ & _ & _ & _ & _ & _ & Happ).
  split.
  - intros x D. destruct (in_dom_id vars x D) as [Hs Ex]. rewrite <- Ex.
    destruct (check_rules_valuations vars invs evs valid repair apply Hrules Hnodup _ Hs) as (_ & R & _).
    rewrite <- R. apply id_in_dom. rewrite <- EN. apply (rep_lt valid repair apply pairs init wf_of_cert). unfold N in EN; lia.
  - intros k x D. destruct (Nat.lt_ge_cases k M) as [Hk|Hk]; [|rewrite revent_out; auto].
    destruct (in_dom_id vars x D) as [Hs Ex]. rewrite <- Ex.
    destruct (check_rules_valuations vars invs evs valid repair apply Hrules Hnodup _ Hs) as (_ & _ & E).
    rewrite <- E by auto. apply id_in_dom. rewrite <- EN. apply Happ; unfold N in *; lia.
Qed.

(** The headline of this section: "match" and a certified verdict with CC2 (domain "valid") make
    the rules machine governed on the valuations in range, with the independence the verdict
    checked. *)
Theorem tables_governed : closed invs evs (in_dom vars) /\ governed invs evs (in_dom vars) (t_indep apply pairs).
Proof.
  split; [exact tables_closed|].
  destruct sizes as [EN EM].
  destruct (bridge_facts valid repair apply pairs init Hcert Hcc2) as (_ & _ & _ & _ & Hr & _ & _ & Happ).
  destruct (t_wfc valid repair apply pairs init Hcert Hcc2) as [phi Hphi].
  assert (CR := check_rules_valuations vars invs evs valid repair apply Hrules Hnodup).
  set (nf := t_nf valid repair apply pairs init).
  assert (Idem : forall s, nf (nf s) = nf s).
  { intros s. apply (path_from_valid (t_valid valid) (t_rho valid repair init)).
    - apply t_nf_path; auto.
    - apply (path_valid (t_valid valid) (t_rho valid repair init) s). apply t_nf_path; auto. }
  refine (governed_transport nat (fun s => s < N) (t_valid valid) (t_rho valid repair init) tb_apply nf phi
           (t_indep apply pairs) _ _ _ _ _ invs evs (in_dom vars) (id_of vars) (val_of vars) _ _ _ _ _ _).
  - intros s Hs. unfold N in *. unfold t_rho. apply Nat.ltb_lt in Hs as Hs'. rewrite Hs'.
    apply (rep_lt valid repair apply pairs init wf_of_cert); auto.
  - intros s _ V. apply Hphi, V.
  - intros s _. apply t_nf_path; auto.
  - intros k l s I Hs V. unfold tb_apply.
    assert (B : forall a b, t_indep apply pairs a b -> a < M /\ b < M).
    { intros a b [H|H]; destruct (Hr _ _ H); lia. }
    destruct (B k l I) as [Bk Bl]. apply Nat.ltb_lt in Bk, Bl. rewrite Bk, Bl.
    apply (t_cc1 valid repair apply pairs init Hcert Hcc2 k l s I V).
  - intros k s _. unfold tb_apply. destruct (Nat.ltb k M); [|symmetry; apply Idem].
    apply (t_cc2 valid repair apply pairs init Hcert Hcc2 k s).
  - exact tables_closed.
  - intros x D. destruct (in_dom_id vars x D). split; [unfold N; lia|auto].
  - intros s Hs. apply id_in_dom. unfold N in *; lia.
  - intros x D. destruct (in_dom_id vars x D) as [Hs Ex]. rewrite <- Ex at 1.
    destruct (CR _ Hs) as (V & _ & _). rewrite <- V. unfold t_valid.
    assert (Hs' : id_of vars x < mlen valid) by (unfold N in *; lia). apply Nat.ltb_lt in Hs'. rewrite Hs'. reflexivity.
  - intros x D. destruct (in_dom_id vars x D) as [Hs Ex]. rewrite <- Ex at 1.
    destruct (CR _ Hs) as (_ & R & _). rewrite <- R.
    assert (Hs' : id_of vars x < mlen valid) by (unfold N in *; lia).
    assert (Hl := rep_lt valid repair apply pairs init wf_of_cert _ Hs').
    unfold t_rho. apply Nat.ltb_lt in Hs' as Hs''. rewrite Hs''. unfold rep in *.
    apply (proj2 (id_in_dom vars (vnth repair (id_of vars x)) ltac:(unfold N in *; lia))).
  - intros k x D. destruct (in_dom_id vars x D) as [Hs Ex]. unfold tb_apply.
    destruct (Nat.ltb k M) eqn:Hk; [apply Nat.ltb_lt in Hk|apply Nat.ltb_ge in Hk; rewrite revent_out; auto].
    rewrite <- Ex at 1. destruct (CR _ Hs) as (_ & _ & E). rewrite <- E by auto.
    assert (Hs' : id_of vars x < mlen valid) by (unfold N in *; lia).
    assert (Hl := Happ k _ ltac:(unfold N in *; lia) Hs').
    unfold t_apply. apply Nat.ltb_lt in Hs' as Hs''. rewrite Hs''. unfold app in *.
    apply (proj2 (id_in_dom vars (vnth (nth k apply dflt) (id_of vars x)) ltac:(unfold N in *; lia))).
Qed.

End Tables.

(** ** 3. Renumbering a component's variables from 0 *)

Fixpoint ren_expr (f : nat -> nat) (e : expr) : expr :=
  match e with
  | EVar i => EVar (f i)
  | ELit z => ELit z
  | EAdd a b => EAdd (ren_expr f a) (ren_expr f b)
  | ESub a b => ESub (ren_expr f a) (ren_expr f b)
  | EMin a b => EMin (ren_expr f a) (ren_expr f b)
  | EMax a b => EMax (ren_expr f a) (ren_expr f b)
  | EIte p a b => EIte (ren_expr f p) (ren_expr f a) (ren_expr f b)
  | EEq a b => EEq (ren_expr f a) (ren_expr f b)
  | ELt a b => ELt (ren_expr f a) (ren_expr f b)
  | ELe a b => ELe (ren_expr f a) (ren_expr f b)
  | EAnd p q => EAnd (ren_expr f p) (ren_expr f q)
  | EOr p q => EOr (ren_expr f p) (ren_expr f q)
  | ENot p => ENot (ren_expr f p)
  end.

Definition ren_asg (f : nat -> nat) (asg : assignment) : assignment :=
  map (fun p => (f (fst p), ren_expr f (snd p))) asg.

(** A rule with every variable [v] renamed [f v]. *)
Definition ren_rule (f : nat -> nat) (r : rule) : rule := (ren_expr f (fst r), ren_asg f (snd r)).

(** The position of [v] in [vs] (the length of [vs] when absent): a component's own number for
    the whole machine's variable [v], when [vs] lists the component's variables in order. *)
Fixpoint pos (vs : list nat) (v : nat) : nat :=
  match vs with [] => 0 | w :: t => if Nat.eqb w v then 0 else S (pos t v) end.

(** The component's valuation of a whole valuation, and back (other variables at 0). *)
Definition loc (vs : list nat) (x : val) : val := map (get x) vs.
Definition emb (vs : list nat) (n : nat) (y : val) : val := map (fun i => get y (pos vs i)) (seq 0 n).

Lemma eval_ren y f e : eval y (ren_expr f e) = eval (fun v => y (f v)) e.
Proof. induction e; simpl; try rewrite IHe1, IHe2; try rewrite IHe3; try rewrite IHe; auto. Qed.


Lemma pos_lt vs v : In v vs -> pos vs v < length vs.
Proof. induction vs as [|w t IH]; simpl; [tauto|]. destruct (Nat.eqb w v) eqn:E; [lia|]. intros [->|H]; [rewrite Nat.eqb_refl in E; discriminate|]. specialize (IH H). lia. Qed.

Lemma pos_out vs v : ~ In v vs -> pos vs v = length vs.
Proof. induction vs as [|w t IH]; simpl; auto. intros H. destruct (Nat.eqb w v) eqn:E; [apply Nat.eqb_eq in E; tauto|]. rewrite IH; tauto. Qed.

Lemma nth_pos vs v : In v vs -> nth (pos vs v) vs 0 = v.
Proof. induction vs as [|w t IH]; simpl; [tauto|]. destruct (Nat.eqb w v) eqn:E; [apply Nat.eqb_eq in E; auto|]. intros [->|H]; [rewrite Nat.eqb_refl in E; discriminate|auto]. Qed.

Lemma pos_nth vs j : NoDup vs -> j < length vs -> pos vs (nth j vs 0) = j.
Proof.
  intros Hd. revert j. induction Hd as [|w t Hw Hd IH]; intros j Hj; simpl in *; [lia|].
  destruct j as [|j]; [rewrite Nat.eqb_refl; auto|].
  destruct (Nat.eqb w (nth j t 0)) eqn:E; [apply Nat.eqb_eq in E; subst; exfalso; apply Hw, nth_In; lia|].
  rewrite IH; auto. lia.
Qed.

Lemma pos_eqb vs j i : NoDup vs -> j < length vs -> Nat.eqb j (pos vs i) = Nat.eqb (nth j vs 0) i.
Proof.
  intros Hd Hj. destruct (in_dec Nat.eq_dec i vs) as [Hi|Hi].
  - destruct (Nat.eqb (nth j vs 0) i) eqn:E.
    + apply Nat.eqb_eq in E. subst. rewrite pos_nth; auto. apply Nat.eqb_refl.
    + apply Nat.eqb_neq. intros ->. rewrite nth_pos in E by auto. rewrite Nat.eqb_refl in E. discriminate.
  - rewrite pos_out by auto. destruct (Nat.eqb (nth j vs 0) i) eqn:E.
    + apply Nat.eqb_eq in E. subst. exfalso. apply Hi, nth_In, Hj.
    + apply Nat.eqb_neq. lia.
Qed.

Lemma assign_ren y f asg j w : (forall i, Nat.eqb j (f i) = Nat.eqb w i) ->
  assign_fn y (ren_asg f asg) j = assign_fn (fun v => y (f v)) asg w.
Proof.
  intros H. induction asg as [|[i e] t IH]; simpl.
  - specialize (H w). rewrite Nat.eqb_refl in H. apply Nat.eqb_eq in H. subst. reflexivity.
  - rewrite H, eval_ren, IH. reflexivity.
Qed.

Section Loc.
Variables (Q : nat -> bool) (vs : list nat) (n : nat).
Hypothesis Hnd : NoDup vs.
Hypothesis Hvs : forall v, In v vs <-> Q v = true.
Hypothesis Hn : forall v, Q v = true -> v < n.

Let R := ren_rule (pos vs).

Lemma length_loc x : length (loc vs x) = length vs.
Proof. unfold loc. apply map_length. Qed.

Lemma get_loc x j : j < length vs -> get (loc vs x) j = get x (nth j vs 0).
Proof. intros H. unfold get at 1, loc. apply nth_map_lt. auto. Qed.

Lemma agree_loc x : agree Q (fun v => get (loc vs x) (pos vs v)) (get x).
Proof. intros v Hv. apply Hvs in Hv. rewrite get_loc by (apply pos_lt; auto). rewrite nth_pos; auto. Qed.

Lemma holds_loc r x : confined Q r -> holds (loc vs x) (fst (R r)) = holds x (fst r).
Proof.
  intros [H1 _]. unfold holds, R, ren_rule. simpl. rewrite eval_ren. f_equal. apply H1, agree_loc.
Qed.

Lemma upd_loc r x : confined Q r -> length x = n -> loc vs (upd x (snd r)) = upd (loc vs x) (snd (R r)).
Proof.
  intros (_ & _ & H3) Hl. apply val_ext; [rewrite length_upd, !length_loc; auto|].
  intros j Hj. rewrite length_loc in Hj.
  assert (Hin : In (nth j vs 0) vs) by (apply nth_In; auto).
  rewrite get_loc, get_upd by (auto; rewrite ?length_loc; auto; rewrite Hl; apply Hn, Hvs, Hin).
  rewrite get_upd by (rewrite length_loc; auto).
  unfold R, ren_rule. simpl. rewrite (assign_ren _ _ _ j (nth j vs 0)) by (intros i; apply pos_eqb; auto).
  symmetry. apply H3; [apply agree_loc|apply Hvs, Hin].
Qed.

Lemma rvalid_loc rs x : (forall k, confined Q (nth k rs noev)) -> rvalid (map R rs) (loc vs x) = rvalid rs x.
Proof.
  induction rs as [|r t IH]; intros H; [reflexivity|]. unfold rvalid in *. cbn [forallb map].
  rewrite (holds_loc r x (H 0)). f_equal. apply IH. intros k. apply (H (S k)).
Qed.

Lemma rrepair_loc rs x : (forall k, confined Q (nth k rs noev)) -> length x = n ->
  loc vs (rrepair rs x) = rrepair (map R rs) (loc vs x).
Proof.
  induction rs as [|r t IH]; intros H Hl; cbn [rrepair map]; auto. rewrite (holds_loc r x (H 0)).
  destruct (holds x (fst r)); [apply IH; auto; intros k; apply (H (S k))|apply upd_loc; auto; apply (H 0)].
Qed.

Lemma revent_loc rs k x : (forall k, confined Q (nth k rs noev)) -> length x = n ->
  loc vs (revent rs k x) = revent (map R rs) k (loc vs x).
Proof.
  intros H Hl. unfold revent. replace noev with (R noev) by reflexivity. rewrite map_nth.
  unfold rapply. rewrite holds_loc by auto. destruct (holds x _); auto. apply upd_loc; auto.
Qed.

Lemma emb_loc x : side_state Q n x -> emb vs n (loc vs x) = x.
Proof.
  intros [Hz Hl]. apply val_ext; [unfold emb; rewrite map_length, seq_length; auto|].
  intros i Hi. unfold emb in Hi. rewrite map_length, seq_length in Hi.
  unfold get at 1, emb. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto). rewrite seq_nth by auto.
  simpl. destruct (in_dec Nat.eq_dec i vs) as [H|H].
  - rewrite get_loc by (apply pos_lt; auto). rewrite nth_pos; auto.
  - rewrite pos_out, get_out by (rewrite ?length_loc; auto). symmetry. apply Hz.
    destruct (Q i) eqn:E; auto. apply Hvs in E. tauto.
Qed.

Lemma loc_emb y : length y = length vs -> loc vs (emb vs n y) = y.
Proof.
  intros Hl. apply val_ext; [rewrite length_loc; auto|]. intros j Hj. rewrite length_loc in Hj.
  assert (Hin : In (nth j vs 0) vs) by (apply nth_In; auto).
  assert (Hlt : nth j vs 0 < n) by (apply Hn, Hvs, Hin).
  rewrite get_loc by auto. unfold get at 1, emb.
  rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto). rewrite seq_nth by auto.
  simpl. rewrite pos_nth; auto.
Qed.

Lemma emb_side y : length y = length vs -> side_state Q n (emb vs n y).
Proof.
  intros Hl. split; [|unfold emb; rewrite map_length, seq_length; auto].
  intros i Hi. destruct (Nat.lt_ge_cases i n) as [H|H].
  - unfold get at 1, emb. rewrite nth_map_lt with (d' := 0) by (rewrite seq_length; auto). rewrite seq_nth by auto.
    simpl. rewrite pos_out; [apply get_out; lia|]. rewrite Hvs, Hi. discriminate.
  - apply get_out. unfold emb. rewrite map_length, seq_length. auto.
Qed.

(** States of the projection, as a test: the whole machine's length, zero off the component. *)
Definition sideb (x : val) : bool :=
  Nat.eqb (length x) n && forallb (fun i => Q i || Z.eqb (get x i) 0) (seq 0 n).

Lemma sideb_spec x : sideb x = true <-> side_state Q n x.
Proof.
  unfold sideb, side_state, zero_off. rewrite andb_true_iff, Nat.eqb_eq, forallb_forall. split.
  - intros [Hl H]. split; auto. intros i Hi. destruct (Nat.lt_ge_cases i n) as [L|L].
    + specialize (H i). rewrite in_seq, Hi in H. simpl in H. apply Z.eqb_eq, H. lia.
    + apply get_out. lia.
  - intros [Hz Hl]. split; auto. intros i _. destruct (Q i) eqn:E; auto. simpl. apply Z.eqb_eq, Hz, E.
Qed.

End Loc.

Lemma in_comp_lt lab c v : in_comp lab c v = true -> v < length lab.
Proof.
  unfold in_comp. destruct (nth_error lab v) eqn:E; [|discriminate]. intros _.
  apply nth_error_Some. rewrite E. discriminate.
Qed.

(** The domain of component [c]'s projection, from the domain [dl] of its renumbered machine:
    states of the whole machine's length, zero off the component, whose renumbering is in [dl]. *)
Definition dom_ren (lab : list nat) (c : nat) (vs : list nat) (dl : val -> bool) (x : val) : bool :=
  sideb (inA lab c) (length lab) x && dl (loc vs x).

(** The component's rules renumbered: its invariants (or events), in order, variable [v] renamed
    to its position in [vs]. *)
Definition ren_invs (c : nat) (vs : list nat) (rs : list rule) (ls : list nat) : list rule :=
  map (ren_rule (pos vs)) (keep_rules (isA c) rs ls).

Section Renumber.
Variables (lab : list nat) (c : nat) (invs : list rule) (inv_lab : list nat) (evs : list rule) (ev_lab : list nat).
Hypothesis Hcheck : check_decomposition lab invs inv_lab evs ev_lab = true.
Variable vs : list nat.
Hypothesis Hnd : NoDup vs.
Hypothesis Hvs : forall v, In v vs <-> in_comp lab c v = true.
Variables (dl : val -> bool) (indep : nat -> nat -> Prop).
Hypothesis Hdl : forall y, dl y = true -> length y = length vs.

(** Component [c]'s machine numbering its own variables from 0, closed and governed on [dl], makes
    the projection of ComposeRules.v (the whole numbering, other variables at 0) closed and
    governed on the states zero off the component whose renumbering is in [dl]. *)
Theorem renumber_governed :
  closed (ren_invs c vs invs inv_lab) (ren_invs c vs evs ev_lab) dl ->
  governed (ren_invs c vs invs inv_lab) (ren_invs c vs evs ev_lab) dl indep ->
  closed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (dom_ren lab c vs dl)
  /\ governed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (dom_ren lab c vs dl) indep.
Proof.
  intros [CR CA] (nf & phi & W & P & C1 & C2).
  set (Q := inA lab c). set (n := length lab).
  assert (Hvs' : forall v, In v vs <-> Q v = true) by exact Hvs.
  assert (Hn : forall v, Q v = true -> v < n) by (intros v; apply in_comp_lt).
  assert (CI : forall k, confined Q (nth k (keep_rules (isA c) invs inv_lab) noev))
    by (intros k; apply confined_A, (Hinvs lab invs inv_lab evs ev_lab Hcheck)).
  assert (CE : forall k, confined Q (nth k (keep_rules (isA c) evs ev_lab) noev))
    by (intros k; apply confined_A, (Hevs lab invs inv_lab evs ev_lab Hcheck)).
  assert (Side : forall x, dom_ren lab c vs dl x = true -> side_state Q n x /\ dl (loc vs x) = true).
  { intros x D. unfold dom_ren in D. apply andb_prop in D as [S D]. split; auto. apply (sideb_spec Q n), S. }
  assert (Cl : closed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (dom_ren lab c vs dl)).
  { split.
    - intros x D. destruct (Side x D) as [S Dl]. unfold dom_ren. apply andb_true_intro. split.
      + apply (sideb_spec Q n). apply rrepair_side; auto.
      + rewrite (rrepair_loc Q vs n Hnd Hvs' Hn) by (auto; apply S). apply CR, Dl.
    - intros k x D. destruct (Side x D) as [S Dl]. unfold dom_ren. apply andb_true_intro. split.
      + apply (sideb_spec Q n). apply revent_side; auto.
      + rewrite (revent_loc Q vs n Hnd Hvs' Hn) by (auto; apply S). apply CA, Dl. }
  split; [exact Cl|].
  refine (governed_transport val (fun y => dl y = true) (rvalid (ren_invs c vs invs inv_lab))
            (rrepair (ren_invs c vs invs inv_lab)) (revent (ren_invs c vs evs ev_lab)) nf phi indep
            CR W P C1 C2 _ _ _ (loc vs) (emb vs n) Cl _ _ _ _ _).
  - intros x D. destruct (Side x D) as [S Dl]. split; auto. apply (emb_loc Q vs n Hvs'), S.
  - intros y Dy. assert (L := Hdl y Dy). rewrite (loc_emb Q vs n Hnd Hvs' Hn y L). split; auto.
    unfold dom_ren. rewrite (loc_emb Q vs n Hnd Hvs' Hn y L), Dy, andb_true_r.
    apply (sideb_spec Q n), (emb_side Q vs n Hvs'), L.
  - intros x D. symmetry. apply (rvalid_loc Q vs Hvs'), CI.
  - intros x D. apply (rrepair_loc Q vs n Hnd Hvs' Hn); auto. apply Side, D.
  - intros k x D. apply (revent_loc Q vs n Hnd Hvs' Hn); auto. apply Side, D.
Qed.

End Renumber.

(** ** 4. The headline: each component's certificate makes the whole machine governed *)

(** A component's variable ranges: the whole machine's, for its variables [vs], in order. *)
Definition comp_vars (vars : list (Z * nat)) (vs : list nat) : list (Z * nat) :=
  map (fun v => nth v vars (0%Z, 0)) vs.

(** What is checked of component [c]: its variables [vs] are exactly those labelled [c], each
    once; the extracted [check_rules] matches its renumbered rules over its variable ranges with
    its tables (assignments setting each variable at most once, as the front end requires); the
    extracted [check_tables] certifies those tables with domain "valid" and reports CC2. *)
Definition comp_checked (vars : list (Z * nat)) (lab : list nat) (invs : list rule) (inv_lab : list nat)
    (evs : list rule) (ev_lab : list nat) (c : nat) (vs : list nat)
    (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat) : Prop :=
  NoDup vs /\ (forall v, In v vs <-> in_comp lab c v = true)
  /\ check_rules (comp_vars vars vs) (ren_invs c vs invs inv_lab) (ren_invs c vs evs ev_lab) valid repair apply = None
  /\ (forall r, In r (ren_invs c vs invs inv_lab) \/ In r (ren_invs c vs evs ev_lab) -> NoDup (map fst (snd r)))
  /\ v_certified (check_tables valid repair apply pairs false init) = true
  /\ v_cc2 (check_tables valid repair apply pairs false init) = true.

(** One component: its certificate makes its projection (whole numbering) closed and governed on
    the states zero off it whose renumbering has every variable in range. *)
Theorem component_governed vars lab invs inv_lab evs ev_lab c vs valid repair apply pairs init :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  comp_checked vars lab invs inv_lab evs ev_lab c vs valid repair apply pairs init ->
  closed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab) (dom_ren lab c vs (in_dom (comp_vars vars vs)))
  /\ governed (keep_rules (isA c) invs inv_lab) (keep_rules (isA c) evs ev_lab)
       (dom_ren lab c vs (in_dom (comp_vars vars vs))) (t_indep apply pairs).
Proof.
  intros H (Hnd & Hvs & Hr & Hn & Hc & H2).
  destruct (tables_governed _ _ _ _ _ _ _ _ Hr Hn Hc H2) as [C G].
  apply renumber_governed; auto.
  intros y D. unfold in_dom, comp_vars in D. apply andb_prop in D as [D _]. apply Nat.eqb_eq in D.
  rewrite D, map_length. reflexivity.
Qed.

(** The headline.  A rules machine that passes the extracted decomposition check, whose every
    label is one of the components [cs], each of which passes [comp_checked] (the checks the engine
    and [govern check] run per component), is closed and governed on the nested product of the
    components' domains, with the independence the components' tables check (pairs across
    components: always): WFC, a normal form its own repair loop reaches, CC1 and CC2. *)
Theorem check_components_governed vars lab invs inv_lab evs ev_lab cs
    (vs : nat -> list nat) (valid : nat -> mask) (repair : nat -> vec) (apply : nat -> list vec)
    (pairs : nat -> option (list (nat * nat))) (init : nat -> nat) :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  (forall l, In l inv_lab \/ In l ev_lab -> In l cs) ->
  (forall c, In c cs -> comp_checked vars lab invs inv_lab evs ev_lab c (vs c) (valid c) (repair c) (apply c) (pairs c) (init c)) ->
  let dom := dom_all lab cs (fun c => dom_ren lab c (vs c) (in_dom (comp_vars vars (vs c)))) in
  let indep := indep_all cs evs ev_lab (fun c => t_indep (apply c) (pairs c)) in
  closed invs evs dom /\ governed invs evs dom indep.
Proof.
  intros H Hl Hc.
  apply (rules_components_governed lab (fun c => dom_ren lab c (vs c) (in_dom (comp_vars vars (vs c))))
           (fun c => t_indep (apply c) (pairs c)) cs invs inv_lab evs ev_lab H Hl).
  intros c Ic. apply (component_governed vars lab invs inv_lab evs ev_lab c (vs c) (valid c) (repair c) (apply c) (pairs c) (init c) H).
  apply Hc, Ic.
Qed.

(** Hence the whole machine converges on that domain: every run of its rewrite system (events
    and repair steps in any interleaving) terminates, and all runs from one configuration that end
    with no pending event in a valid state end in the same state. *)
Theorem check_components_converge vars lab invs inv_lab evs ev_lab cs vs valid repair apply pairs init :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  (forall l, In l inv_lab \/ In l ev_lab -> In l cs) ->
  (forall c, In c cs -> comp_checked vars lab invs inv_lab evs ev_lab c (vs c) (valid c) (repair c) (apply c) (pairs c) (init c)) ->
  let dom := dom_all lab cs (fun c => dom_ren lab c (vs c) (in_dom (comp_vars vars (vs c)))) in
  let indep := indep_all cs evs ev_lab (fun c => t_indep (apply c) (pairs c)) in
  forall Hc : closed invs evs dom,
  (forall cf, SN (G (D val dom) nat Nat.eq_dec (g_valid invs dom) (g_rho invs evs dom Hc) (g_apply invs evs dom Hc) indep) cf)
  /\ (forall cf s1 s2,
       star (G (D val dom) nat Nat.eq_dec (g_valid invs dom) (g_rho invs evs dom Hc) (g_apply invs evs dom Hc) indep) cf (s1, []) ->
       star (G (D val dom) nat Nat.eq_dec (g_valid invs dom) (g_rho invs evs dom Hc) (g_apply invs evs dom Hc) indep) cf (s2, []) ->
       g_valid invs dom s1 = true -> g_valid invs dom s2 = true -> s1 = s2).
Proof.
  intros H Hl Hcs dom indep Hc.
  destruct (check_components_governed vars lab invs inv_lab evs ev_lab cs vs valid repair apply pairs init H Hl Hcs) as [_ Gv].
  split; [apply (governed_terminating invs evs dom indep Hc Gv)|apply (governed_unique_normal_forms invs evs dom indep Hc Gv)].
Qed.

(** ** 5. The product domain is "every variable in its range"

    When the components are distinct and every variable belongs to one of them (as the engine's
    decomposition makes them), the nested domain of the headline is, at the whole machine's
    length, the whole machine's domain: every variable in its range. *)

(** Variable [i]'s value [z] is in its range. *)
Definition rng (vars : list (Z * nat)) (i : nat) (z : Z) : Prop :=
  let '(lo, size) := nth i vars (0%Z, 0) in (lo <= z < lo + Z.of_nat size)%Z.

Lemma in_rangeb_map (f : nat -> Z * nat) l g : in_rangeb (map f l) g = true <->
  forall j, j < length l -> let '(lo, size) := f (nth j l 0) in (lo <= g j < lo + Z.of_nat size)%Z.
Proof.
  revert g. induction l as [|a t IH]; intros g; simpl.
  - split; auto. intros _ j H. lia.
  - destruct (f a) as [lo size] eqn:Fa. rewrite !andb_true_iff, Z.leb_le, Z.ltb_lt, IH. split.
    + intros [[A B] C] [|j] Hj; [simpl; rewrite Fa; lia|]. apply (C j). lia.
    + intros H. specialize (H 0 ltac:(lia)) as H0. simpl in H0. rewrite Fa in H0. split; [lia|].
      intros j Hj. apply (H (S j)). lia.
Qed.

Lemma in_rangeb_all vars g : in_rangeb vars g = true <-> forall i, i < length vars -> rng vars i (g i).
Proof.
  revert g. induction vars as [|[lo size] t IH]; intros g; cbn [in_rangeb length].
  - split; auto. intros _ i H. lia.
  - rewrite !andb_true_iff, Z.leb_le, Z.ltb_lt, IH. split.
    + intros [[A B] C] [|i] Hi; unfold rng; simpl; [lia|]. apply (C i). lia.
    + intros H. pose proof (H 0 ltac:(lia)) as H0. unfold rng in H0. simpl in H0.
      split; [lia|]. intros i Hi. apply (H (S i)). lia.
Qed.

Lemma dom_ren_keep vars lab c vs x : NoDup vs -> (forall v, In v vs <-> in_comp lab c v = true) ->
  length x = length lab ->
  dom_ren lab c vs (in_dom (comp_vars vars vs)) (keep (inA lab c) x) = true <->
  forall i, in_comp lab c i = true -> rng vars i (get x i).
Proof.
  intros Hnd Hvs Hl. unfold dom_ren, in_dom.
  assert (S : sideb (inA lab c) (length lab) (keep (inA lab c) x) = true).
  { apply sideb_spec. rewrite <- Hl. apply keep_side_A. }
  rewrite S, length_loc. unfold comp_vars. rewrite map_length, Nat.eqb_refl. simpl.
  rewrite in_rangeb_map. split.
  - intros H i Hi. apply Hvs in Hi as Hin. specialize (H (pos vs i) (pos_lt vs i Hin)).
    rewrite nth_pos in H by auto. rewrite get_loc, nth_pos, get_keep in H by (auto; apply pos_lt; auto).
    unfold inA in H. rewrite Hi in H. exact H.
  - intros H j Hj. assert (Hin : In (nth j vs 0) vs) by (apply nth_In; auto).
    rewrite get_loc, get_keep by auto. unfold inA. apply Hvs in Hin. rewrite Hin. apply H, Hin.
Qed.

Lemma dom_all_spec vars lab (vs : nat -> list nat) : forall cs, NoDup cs ->
  (forall c, In c cs -> NoDup (vs c) /\ forall v, In v (vs c) <-> in_comp lab c v = true) ->
  forall x, length x = length lab ->
  dom_all lab cs (fun c => dom_ren lab c (vs c) (in_dom (comp_vars vars (vs c)))) x = true <->
  forall i c, In c cs -> in_comp lab c i = true -> rng vars i (get x i).
Proof.
  induction cs as [|c cs IH]; intros Hnd Hc x Hl; simpl.
  - split; [intros _ i c []|auto].
  - inversion Hnd as [|? ? Hni Hnd']; subst. destruct (Hc c (or_introl eq_refl)) as [Hd Hv].
    unfold domW. rewrite andb_true_iff, dom_ren_keep by auto.
    rewrite IH by (first [exact Hnd' | intros c' Ic'; apply Hc; simpl; auto
                         | unfold keep; rewrite map_length, seq_length; auto]).
    assert (Other : forall i c', In c' cs -> in_comp lab c' i = true -> get (keep (inB lab c) x) i = get x i).
    { intros i c' Ic' Hi. rewrite get_keep. unfold inB. destruct (in_comp lab c i) eqn:E; auto.
      exfalso. apply Hni. rewrite (in_comp_unique lab c c' i E Hi). exact Ic'. }
    split.
    + intros [A B] i c' [<-|Ic'] Hi; [apply A, Hi|]. rewrite <- (Other i c'); auto. apply (B i c'); auto.
    + intros H. split; [intros i Hi; apply (H i c); auto|].
      intros i c' Ic' Hi. rewrite (Other i c'); auto. apply (H i c'); auto.
Qed.

Lemma governed_sub invs evs (D E : val -> bool) indep : (forall x, E x = true -> D x = true) ->
  governed invs evs D indep -> governed invs evs E indep.
Proof.
  intros H (nf & phi & W & P & C1 & C2). exists nf, phi.
  split; [|split; [|split]]; intros; [apply W|apply P|apply C1|apply C2]; auto.
Qed.

(** The headline on the whole machine's own domain: when the components [cs] are distinct and
    every variable belongs to one of them, the whole rules machine is closed and governed on the
    valuations with every variable in its range. *)
Theorem check_components_governed_in_range vars lab invs inv_lab evs ev_lab cs
    (vs : nat -> list nat) (valid : nat -> mask) (repair : nat -> vec) (apply : nat -> list vec)
    (pairs : nat -> option (list (nat * nat))) (init : nat -> nat) :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  (forall l, In l inv_lab \/ In l ev_lab -> In l cs) ->
  (forall c, In c cs -> comp_checked vars lab invs inv_lab evs ev_lab c (vs c) (valid c) (repair c) (apply c) (pairs c) (init c)) ->
  NoDup cs -> (forall i, i < length lab -> In (nth i lab 0) cs) -> length vars = length lab ->
  let indep := indep_all cs evs ev_lab (fun c => t_indep (apply c) (pairs c)) in
  closed invs evs (in_dom vars) /\ governed invs evs (in_dom vars) indep.
Proof.
  intros H Hl Hc Hnd Hcov Hlv indep.
  destruct (check_components_governed vars lab invs inv_lab evs ev_lab cs vs valid repair apply pairs init H Hl Hc)
    as [[CR CA] G].
  set (D := dom_all lab cs (fun c => dom_ren lab c (vs c) (in_dom (comp_vars vars (vs c))))) in *.
  assert (Hcs : forall c, In c cs -> NoDup (vs c) /\ forall v, In v (vs c) <-> in_comp lab c v = true).
  { intros c Ic. destruct (Hc c Ic) as (A & B & _). auto. }
  assert (Spec : forall x, length x = length lab -> D x = true <-> in_dom vars x = true).
  { intros x Lx. unfold D. rewrite (dom_all_spec vars lab vs cs Hnd Hcs x Lx).
    unfold in_dom. rewrite andb_true_iff, Nat.eqb_eq, in_rangeb_all. split.
    - intros A. split; [lia|]. intros i Hi. apply (A i (nth i lab 0)); [apply Hcov; lia|].
      unfold in_comp. rewrite (nth_error_nth' lab 0) by lia. apply Nat.eqb_refl.
    - intros [_ A] i c _ Hi. apply A. rewrite Hlv. apply (in_comp_lt lab c), Hi. }
  assert (Len : forall x, in_dom vars x = true -> length x = length lab).
  { intros x Ex. unfold in_dom in Ex. apply andb_prop in Ex as [Ex _]. apply Nat.eqb_eq in Ex. lia. }
  assert (Sub : forall x, in_dom vars x = true -> D x = true) by (intros x Ex; apply Spec; auto).
  split; [split|].
  - intros x Ex. apply Spec; [rewrite length_rrepair; auto|]. apply CR, Sub, Ex.
  - intros k x Ex. apply Spec; [rewrite length_revent; auto|]. apply CA, Sub, Ex.
  - apply (governed_sub invs evs D (in_dom vars) indep Sub G).
Qed.
