(** * Composition: machines with disjoint closed footprints.

    Two parts.

    1. The decomposition check, extracted ([check_decomposition]): given the rules AST (as the
       rules checker reads it) and a claimed component for every variable, invariant and event, it
       checks that every rule reads and writes only variables of its own component.  Its soundness
       ([check_decomposition_sound]): each rule's condition reads only its component (two states
       that agree there give the same value) and its assignment writes only its component (every
       other variable keeps its value); hence rules of different components commute at every
       state ([cross_commute]).  The components are therefore disjoint (a variable has one label)
       and closed (no rule leaves its component).

    2. The composition theorem, over any two machines in the abstract setting of Governance.v:
       the product machine (states are pairs, an event acts on its own half, repair repairs either
       half in any order the machine chooses) satisfies WFC, CC1 and CC2 whenever both components
       do ([compose_wfc], [compose_nf_path], [compose_cc1], [compose_cc2]), so it converges: unique
       normal forms under any interleaving of delivery and compensation ([compose_unique_normal_forms])
       and the same final state for every delivery order ([compose_stream_convergence]).  Cross pairs
       commute at every valid state ([compose_cross_valid], no CC2 needed) and, with CC2, at every state
       ([compose_cross]); within a component, a pair commutes (and an event is
       idempotent) on the product's valid states exactly when it does on the component's
       ([compose_commute_iff], [compose_idem_iff]): obligations and idempotence are lifted unchanged;
       a normalized run is the pair of the components' runs ([compose_run]), so trace equivalence
       (swapping adjacent independent events) lifts too ([compose_swap]); [compose_cc1], [compose_run]
       and [compose_swap] need only WFC and CC1 of the components, not CC2.  Many components are
       nested pairs. *)

From Coq Require Import List Arith Bool Lia ZArith Permutation.
From Govern Require Import Vec ZVec TableCheck Rules Newman Governance.
Import ListNotations.

(** ** 1. The decomposition check *)

Definition in_comp (lab : list nat) (c : nat) (i : nat) : bool :=
  match nth_error lab i with Some d => Nat.eqb d c | None => false end.

Fixpoint expr_in (lab : list nat) (c : nat) (e : expr) : bool :=
  match e with
  | EVar i => in_comp lab c i
  | ELit _ => true
  | EAdd a b | ESub a b | EMin a b | EMax a b | EEq a b | ELt a b | ELe a b | EAnd a b | EOr a b =>
      andb (expr_in lab c a) (expr_in lab c b)
  | EIte x a b => andb (expr_in lab c x) (andb (expr_in lab c a) (expr_in lab c b))
  | ENot p => expr_in lab c p
  end.

Fixpoint asg_in (lab : list nat) (c : nat) (asg : assignment) (acc : bool) : bool :=
  match asg with
  | [] => acc
  | (i, e) :: t => asg_in lab c t (andb acc (andb (in_comp lab c i) (expr_in lab c e)))
  end.

Definition rule_in (lab : list nat) (c : nat) (r : expr * assignment) : bool :=
  andb (expr_in lab c (fst r)) (asg_in lab c (snd r) true).

Fixpoint rules_in (lab : list nat) (rs : list (expr * assignment)) (cs : list nat) (acc : bool) : bool :=
  match rs, cs with
  | [], [] => acc
  | r :: rt, c :: ct => rules_in lab rt ct (andb acc (rule_in lab c r))
  | _, _ => false
  end.

(** [lab]: the component of every variable; [inv_lab], [ev_lab]: of every invariant and event. *)
Definition check_decomposition (lab : list nat) (invs : list (expr * assignment)) (inv_lab : list nat)
    (evs : list (expr * assignment)) (ev_lab : list nat) : bool :=
  andb (rules_in lab invs inv_lab true) (rules_in lab evs ev_lab true).

(** The value-level meaning of a rule's assignment (simultaneous, first binding wins) and of a
    guarded rule (its assignment where its condition holds, else nothing). *)
Fixpoint assign_fn (x : nat -> Z) (asg : assignment) (i : nat) : Z :=
  match asg with
  | [] => x i
  | (j, e) :: t => if Nat.eqb i j then eval x e else assign_fn x t i
  end.

Definition rule_fn (r : expr * assignment) (x : nat -> Z) : nat -> Z :=
  if nz (eval x (fst r)) then assign_fn x (snd r) else x.

Lemma in_comp_unique lab c d i : in_comp lab c i = true -> in_comp lab d i = true -> c = d.
Proof.
  unfold in_comp. destruct (nth_error lab i); [|discriminate].
  intros A B. apply Nat.eqb_eq in A. apply Nat.eqb_eq in B. congruence.
Qed.

Lemma expr_in_local lab c e x y : expr_in lab c e = true ->
  (forall i, in_comp lab c i = true -> x i = y i) -> eval x e = eval y e.
Proof.
  intros H Hxy. induction e; simpl in *;
    repeat match goal with H : andb _ _ = true |- _ => apply andb_prop in H as [? ?] end;
    repeat match goal with IH : ?P = true -> _, H : ?P = true |- _ => specialize (IH H) end;
    try (rewrite IHe1, IHe2); try (rewrite IHe3); try (rewrite IHe); auto.
Qed.

Lemma asg_in_acc lab c asg acc : asg_in lab c asg acc = true -> acc = true.
Proof.
  revert acc. induction asg as [|[i e] t IH]; simpl; intros acc H; auto.
  apply IH in H. apply andb_prop in H as [H _]. auto.
Qed.

Lemma asg_in_cons lab c i e t acc : asg_in lab c ((i, e) :: t) acc = true ->
  in_comp lab c i = true /\ expr_in lab c e = true /\ asg_in lab c t true = true.
Proof.
  simpl. intros H. pose proof (asg_in_acc _ _ _ _ H) as A.
  apply andb_prop in A as [A1 A2]. apply andb_prop in A2 as [A2 A3]. subst.
  split; auto. split; auto.
  assert (E : forall t acc, asg_in lab c t acc = andb acc (asg_in lab c t true)).
  { clear. induction t as [|[j f] t IH]; intros acc; simpl.
    - destruct acc; auto.
    - rewrite (IH (andb acc _)), (IH (andb (in_comp lab c j) (expr_in lab c f))).
      destruct acc; reflexivity. }
  rewrite E in H. apply andb_prop in H as [_ H]. auto.
Qed.

Lemma assign_frame lab c asg x i : asg_in lab c asg true = true -> in_comp lab c i = false ->
  assign_fn x asg i = x i.
Proof.
  induction asg as [|[j e] t IH]; intros H Hi; simpl; auto.
  apply asg_in_cons in H as (Hj & _ & Ht).
  destruct (Nat.eqb i j) eqn:E; [apply Nat.eqb_eq in E; subst; congruence|auto].
Qed.

Lemma assign_local lab c asg x y i : asg_in lab c asg true = true ->
  (forall k, in_comp lab c k = true -> x k = y k) -> in_comp lab c i = true ->
  assign_fn x asg i = assign_fn y asg i.
Proof.
  induction asg as [|[j e] t IH]; intros H Hxy Hi; simpl; auto.
  apply asg_in_cons in H as (Hj & He & Ht).
  destruct (Nat.eqb i j); [apply expr_in_local with lab c; auto|auto].
Qed.

(** A rule that passes the check writes only its component and reads only its component. *)
Lemma rule_frame lab c r x i : rule_in lab c r = true -> in_comp lab c i = false -> rule_fn r x i = x i.
Proof.
  unfold rule_in, rule_fn. intros H Hi. apply andb_prop in H as [_ H].
  destruct (nz (eval x (fst r))); auto. apply assign_frame with lab c; auto.
Qed.

Lemma rule_local lab c r x y i : rule_in lab c r = true ->
  (forall k, in_comp lab c k = true -> x k = y k) -> in_comp lab c i = true -> rule_fn r x i = rule_fn r y i.
Proof.
  unfold rule_in, rule_fn. intros H Hxy Hi. apply andb_prop in H as [Hc Ha].
  rewrite (expr_in_local lab c (fst r) x y Hc Hxy).
  destruct (nz (eval y (fst r))); [apply assign_local with lab c|]; auto.
Qed.

Lemma rules_in_acc lab rs cs acc : rules_in lab rs cs acc = true -> acc = true.
Proof.
  revert cs acc. induction rs as [|r rt IH]; intros [|c ct] acc; simpl; try discriminate; auto.
  intros H. apply IH in H. apply andb_prop in H as [H _]. auto.
Qed.

Lemma rules_in_len lab rs cs acc : rules_in lab rs cs acc = true -> length cs = length rs.
Proof.
  revert cs acc. induction rs as [|r rt IH]; intros [|c ct] acc; simpl; try discriminate; auto.
  intros H. f_equal. apply (IH ct _ H).
Qed.

Lemma rules_in_nth lab rs cs acc k : rules_in lab rs cs acc = true -> k < length rs ->
  length cs = length rs /\ rule_in lab (nth k cs 0) (nth k rs (ELit 0, [])) = true.
Proof.
  intros H Hk. split; [apply (rules_in_len _ _ _ _ H)|]. revert cs acc k H Hk.
  induction rs as [|r rt IH]; intros [|c ct] acc k H Hk; simpl in *; try discriminate; try lia.
  pose proof (rules_in_acc _ _ _ _ H) as A. apply andb_prop in A as [_ A].
  destruct k as [|k]; auto. apply (IH ct _ k H). lia.
Qed.

(** The headline theorem of the check. *)
Theorem check_decomposition_sound lab invs inv_lab evs ev_lab :
  check_decomposition lab invs inv_lab evs ev_lab = true ->
  length inv_lab = length invs /\ length ev_lab = length evs /\
  (forall k, k < length invs -> let c := nth k inv_lab 0 in let r := nth k invs (ELit 0, []) in
     (forall x y, (forall i, in_comp lab c i = true -> x i = y i) -> eval x (fst r) = eval y (fst r))
     /\ (forall x i, in_comp lab c i = false -> rule_fn r x i = x i)
     /\ (forall x y i, (forall j, in_comp lab c j = true -> x j = y j) -> in_comp lab c i = true ->
           rule_fn r x i = rule_fn r y i)) /\
  (forall k, k < length evs -> let c := nth k ev_lab 0 in let r := nth k evs (ELit 0, []) in
     (forall x i, in_comp lab c i = false -> rule_fn r x i = x i)
     /\ (forall x y i, (forall j, in_comp lab c j = true -> x j = y j) -> in_comp lab c i = true ->
           rule_fn r x i = rule_fn r y i)).
Proof.
  unfold check_decomposition. intros H. apply andb_prop in H as [Hi He].
  assert (LI : length inv_lab = length invs).
  { destruct invs; [destruct inv_lab; simpl in *; try discriminate; auto|].
    apply (rules_in_nth lab _ _ _ 0 Hi); simpl; lia. }
  assert (LE : length ev_lab = length evs).
  { destruct evs; [destruct ev_lab; simpl in *; try discriminate; auto|].
    apply (rules_in_nth lab _ _ _ 0 He); simpl; lia. }
  split; auto. split; auto. split.
  - intros k Hk. destruct (rules_in_nth lab _ _ _ k Hi Hk) as [_ R]. cbv zeta.
    split; [|split].
    + intros x y Hxy. unfold rule_in in R. apply andb_prop in R as [R _]. apply expr_in_local with lab (nth k inv_lab 0); auto.
    + intros x i. apply rule_frame; auto.
    + intros x y i. apply rule_local; auto.
  - intros k Hk. destruct (rules_in_nth lab _ _ _ k He Hk) as [_ R]. cbv zeta.
    split; [intros x i; apply rule_frame; auto|intros x y i; apply rule_local; auto].
Qed.

(** Rules of different components commute at every state, variable by variable. *)
Theorem cross_commute lab c d a b x : rule_in lab c a = true -> rule_in lab d b = true -> c <> d ->
  forall i, rule_fn a (rule_fn b x) i = rule_fn b (rule_fn a x) i.
Proof.
  intros Ha Hb Hcd i.
  assert (Fb : forall y j, in_comp lab c j = true -> rule_fn b y j = y j).
  { intros y j Hj. apply rule_frame with lab d; auto.
    destruct (in_comp lab d j) eqn:E; auto. exfalso. apply Hcd. apply (in_comp_unique lab c d j); auto. }
  assert (Fa : forall y j, in_comp lab d j = true -> rule_fn a y j = y j).
  { intros y j Hj. apply rule_frame with lab c; auto.
    destruct (in_comp lab c j) eqn:E; auto. exfalso. apply Hcd. apply (in_comp_unique lab c d j); auto. }
  destruct (in_comp lab c i) eqn:Ci.
  - rewrite Fb by auto. apply rule_local with lab c; auto.
  - destruct (in_comp lab d i) eqn:Di.
    + rewrite Fa by auto. symmetry. apply rule_local with lab d; auto.
    + rewrite (rule_frame lab c a) by auto. rewrite (rule_frame lab d b) by auto.
      rewrite (rule_frame lab d b) by auto. rewrite (rule_frame lab c a) by auto. reflexivity.
Qed.

(** ** 2. The composition theorem *)

Section Compose.
Variables (SA SB EA EB : Type).
Variable ea_dec : forall x y : EA, {x = y} + {x <> y}.
Variable eb_dec : forall x y : EB, {x = y} + {x <> y}.
Variables (validA : SA -> bool) (validB : SB -> bool).
Variables (rhoA : SA -> SA) (rhoB : SB -> SB).
Variables (applyA : EA -> SA -> SA) (applyB : EB -> SB -> SB).
Variables (indepA : EA -> EA -> Prop) (indepB : EB -> EB -> Prop).
Variables (nfA : SA -> SA) (nfB : SB -> SB).
Variables (phiA : SA -> nat) (phiB : SB -> nat).
Hypothesis wfcA : forall s, validA s = false -> phiA (rhoA s) < phiA s.
Hypothesis wfcB : forall s, validB s = false -> phiB (rhoB s) < phiB s.
Hypothesis pathA : forall s, comp_path SA validA rhoA s (nfA s).
Hypothesis pathB : forall s, comp_path SB validB rhoB s (nfB s).
Definition stepA e s := nfA (applyA e s).
Definition stepB e s := nfB (applyB e s).
Hypothesis cc1A : forall a b s, indepA a b -> validA s = true -> stepA b (stepA a s) = stepA a (stepA b s).
Hypothesis cc1B : forall a b s, indepB a b -> validB s = true -> stepB b (stepB a s) = stepB a (stepB b s).
Hypothesis cc2A : forall e s, stepA e s = stepA e (nfA s).
Hypothesis cc2B : forall e s, stepB e s = stepB e (nfB s).

(** Which half the product repairs first when both are invalid: any choice (the first violated
    invariant in declaration order picks one). *)
Variable pick : SA -> SB -> bool.

Definition PS : Type := (SA * SB)%type.
Definition PE : Type := (EA + EB)%type.

Definition e_dec (x y : PE) : {x = y} + {x <> y}.
Proof. decide equality. Defined.

Definition valid (s : PS) : bool := andb (validA (fst s)) (validB (snd s)).
Definition rho (s : PS) : PS :=
  if andb (negb (validA (fst s))) (orb (pick (fst s) (snd s)) (validB (snd s)))
  then (rhoA (fst s), snd s) else (fst s, rhoB (snd s)).
Definition apply (e : PE) (s : PS) : PS :=
  match e with inl a => (applyA a (fst s), snd s) | inr b => (fst s, applyB b (snd s)) end.
Definition indep (x y : PE) : Prop :=
  match x, y with
  | inl a, inl b => indepA a b
  | inr a, inr b => indepB a b
  | _, _ => True
  end.
Definition nf (s : PS) : PS := (nfA (fst s), nfB (snd s)).
Definition step (e : PE) (s : PS) : PS := nf (apply e s).

Lemma pathA_valid s : validA (nfA s) = true.
Proof. exact (comp_path_valid SA validA rhoA s (nfA s) (pathA s)). Qed.
Lemma pathB_valid s : validB (nfB s) = true.
Proof. exact (comp_path_valid SB validB rhoB s (nfB s) (pathB s)). Qed.
Lemma nfA_id s : validA s = true -> nfA s = s.
Proof. intros H. apply (comp_path_det SA validA rhoA s); auto. constructor; auto. Qed.
Lemma nfB_id s : validB s = true -> nfB s = s.
Proof. intros H. apply (comp_path_det SB validB rhoB s); auto. constructor; auto. Qed.
Lemma nfA_rho s : validA s = false -> nfA (rhoA s) = nfA s.
Proof.
  intros H. apply (comp_path_det SA validA rhoA (rhoA s)); auto.
  pose proof (pathA s) as P. inversion P; subst; congruence.
Qed.
Lemma nfB_rho s : validB s = false -> nfB (rhoB s) = nfB s.
Proof.
  intros H. apply (comp_path_det SB validB rhoB (rhoB s)); auto.
  pose proof (pathB s) as P. inversion P; subst; congruence.
Qed.

Theorem compose_wfc : forall s, valid s = false -> phiA (fst (rho s)) + phiB (snd (rho s)) < phiA (fst s) + phiB (snd s).
Proof.
  intros [a b]. unfold valid, rho; simpl.
  destruct (validA a) eqn:VA, (validB b) eqn:VB, (pick a b); simpl; try discriminate; intros _;
    try (pose proof (wfcA a VA)); try (pose proof (wfcB b VB)); lia.
Qed.

Theorem compose_nf_path : forall s, comp_path PS valid rho s (nf s).
Proof.
  assert (K : forall n a b, phiA a + phiB b < n -> comp_path PS valid rho (a, b) (nfA a, nfB b)).
  { induction n as [|n IH]; intros a b Hn; [lia|].
    destruct (valid (a, b)) eqn:V.
    - unfold valid in V; simpl in V. apply andb_prop in V as [VA VB].
      rewrite (nfA_id a VA), (nfB_id b VB). constructor. unfold valid; simpl. rewrite VA, VB. auto.
    - apply cp_step; auto. pose proof (compose_wfc (a, b) V) as W. simpl in W.
      unfold valid in V; simpl in V. unfold rho in *; simpl in *.
      destruct (validA a) eqn:VA, (validB b) eqn:VB, (pick a b); simpl in *; try discriminate;
        first [ rewrite <- (nfA_rho a VA); apply IH; lia | rewrite <- (nfB_rho b VB); apply IH; lia ]. }
  intros [a b]. apply K with (S (phiA a + phiB b)). lia.
Qed.

Lemma step_inl a s : step (inl a) s = (stepA a (fst s), nfB (snd s)).
Proof. reflexivity. Qed.
Lemma step_inr b s : step (inr b) s = (nfA (fst s), stepB b (snd s)).
Proof. reflexivity. Qed.

Theorem compose_cc2 : forall e s, step e s = step e (nf s).
Proof.
  intros [a|b] [x y]; unfold step, nf, apply; simpl; f_equal.
  - apply cc2A.
  - symmetry. apply nfB_id, pathB_valid.
  - symmetry. apply nfA_id, pathA_valid.
  - apply cc2B.
Qed.

(** Cross pairs commute at every state (no validity, no table). *)
Theorem compose_cross : forall a b s, step (inr b) (step (inl a) s) = step (inl a) (step (inr b) s).
Proof.
  intros a b [x y]. rewrite !step_inl, !step_inr. simpl. f_equal.
  - rewrite (nfA_id (stepA a x)) by (apply pathA_valid). apply cc2A.
  - rewrite (nfB_id (stepB b y)) by (apply pathB_valid). symmetry. apply cc2B.
Qed.

(** At valid states, cross pairs commute without CC2. *)
Theorem compose_cross_valid : forall a b s, valid s = true ->
  step (inr b) (step (inl a) s) = step (inl a) (step (inr b) s).
Proof.
  intros a b [x y] Hv. unfold valid in Hv; simpl in Hv. apply andb_prop in Hv as [VA VB].
  rewrite !step_inl, !step_inr. simpl. rewrite (nfA_id x VA), (nfB_id y VB).
  rewrite (nfA_id (stepA a x)) by (apply pathA_valid). rewrite (nfB_id (stepB b y)) by (apply pathB_valid).
  reflexivity.
Qed.

(** CC1 of the product, from the components' CC1 alone (no CC2). *)
Theorem compose_cc1 : forall a b s, indep a b -> valid s = true -> step b (step a s) = step a (step b s).
Proof.
  intros [a|a] [b|b] [x y] Hi Hv.
  - unfold valid in Hv; simpl in Hv, Hi; apply andb_prop in Hv as [VA VB].
    rewrite !step_inl. simpl. rewrite nfB_id by (apply pathB_valid). f_equal. apply cc1A; auto.
  - apply compose_cross_valid; auto.
  - symmetry. apply compose_cross_valid; auto.
  - unfold valid in Hv; simpl in Hv, Hi; apply andb_prop in Hv as [VA VB].
    rewrite !step_inr. simpl. rewrite nfA_id by (apply pathA_valid). f_equal. apply cc1B; auto.
Qed.

(** Convergence of the product, from Governance.v: every run of the full rewrite system (delivery of
    a pairwise-independent bag, compensation interleaved in any way) ends in the same valid state. *)
Theorem compose_unique_normal_forms : forall c s1 s2,
  star (G PS PE e_dec valid rho apply indep) c (s1, []) -> star (G PS PE e_dec valid rho apply indep) c (s2, []) ->
  valid s1 = true -> valid s2 = true -> s1 = s2.
Proof.
  apply (gov_unique_normal_forms PS PE e_dec valid rho apply indep nf).
  - exists (fun s => phiA (fst s) + phiB (snd s)). apply compose_wfc.
  - apply compose_nf_path.
  - apply compose_cc1.
  - apply compose_cc2.
Qed.

Theorem compose_stream_convergence : forall s b es1 es2,
  pw PE indep b -> Permutation es1 b -> Permutation es2 b ->
  fold_left (fun t e => step e t) es1 (nf s) = fold_left (fun t e => step e t) es2 (nf s).
Proof.
  intros s b es1 es2 Hpw H1 H2.
  apply (stream_convergence PS PE e_dec valid rho apply indep nf) with b; auto.
  - exists (fun s => phiA (fst s) + phiB (snd s)). apply compose_wfc.
  - apply compose_nf_path.
  - apply compose_cc1.
  - apply compose_cc2.
Qed.

(** Obligations and idempotence are lifted unchanged (given a valid state of the other half). *)
Theorem compose_commute_iff : forall a b y, validB y = true ->
  (forall x, validA x = true -> stepA b (stepA a x) = stepA a (stepA b x)) <->
  (forall s, valid s = true -> step (inl b) (step (inl a) s) = step (inl a) (step (inl b) s)).
Proof.
  intros a b y Vy. split.
  - intros H [x z] Hv. unfold valid in Hv; simpl in Hv. apply andb_prop in Hv as [VA VB].
    rewrite !step_inl. simpl. rewrite H by auto. reflexivity.
  - intros H x Vx. specialize (H (x, y)). unfold valid in H; simpl in H. rewrite Vx, Vy in H.
    specialize (H eq_refl). rewrite !step_inl in H. simpl in H. injection H. auto.
Qed.

Theorem compose_idem_iff : forall a y, validB y = true ->
  (forall x, validA x = true -> stepA a (stepA a x) = stepA a x) <->
  (forall s, valid s = true -> step (inl a) (step (inl a) s) = step (inl a) s).
Proof.
  intros a y Vy. split.
  - intros H [x z] Hv. unfold valid in Hv; simpl in Hv. apply andb_prop in Hv as [VA VB].
    rewrite !step_inl. simpl. rewrite H by auto. rewrite !(nfB_id z VB). reflexivity.
  - intros H x Vx. specialize (H (x, y)). unfold valid in H; simpl in H. rewrite Vx, Vy in H.
    specialize (H eq_refl). rewrite !step_inl in H. simpl in H. injection H. auto.
Qed.

(** A normalized run of the product is the pair of the components' runs. *)
Fixpoint lefts (l : list PE) : list EA := match l with [] => [] | inl a :: t => a :: lefts t | inr _ :: t => lefts t end.
Fixpoint rights (l : list PE) : list EB := match l with [] => [] | inr b :: t => b :: rights t | inl _ :: t => rights t end.

Theorem compose_run : forall l x y, validA x = true -> validB y = true ->
  fold_left (fun t e => step e t) l (x, y) =
  (fold_left (fun t e => stepA e t) (lefts l) x, fold_left (fun t e => stepB e t) (rights l) y).
Proof.
  induction l as [|[a|b] t IH]; intros x y Vx Vy; simpl; auto.
  - rewrite step_inl. simpl. rewrite (nfB_id y Vy). apply IH; auto. apply pathA_valid.
  - rewrite step_inr. simpl. rewrite (nfA_id x Vx). apply IH; auto. apply pathB_valid.
Qed.

(** Trace equivalence lifts (from the components' WFC and CC1 alone, no CC2): swapping two adjacent
    independent events anywhere in a normalized run from a valid state does not change where it ends. *)
Theorem compose_swap : forall p q a b s, indep a b -> valid s = true ->
  fold_left (fun t e => step e t) (p ++ a :: b :: q) s = fold_left (fun t e => step e t) (p ++ b :: a :: q) s.
Proof.
  intros p q a b s Hi Hv. rewrite !fold_left_app. simpl.
  assert (V : forall l t, valid t = true -> valid (fold_left (fun t e => step e t) l t) = true).
  { induction l as [|e l IH]; intros t Ht; simpl; auto. apply IH.
    destruct e; unfold step, nf, valid; simpl; rewrite pathA_valid, pathB_valid; auto. }
  rewrite compose_cc1; auto.
Qed.

End Compose.
