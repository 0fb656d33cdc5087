(** * The governance rewrite system and its convergence.

    Configurations are pairs (state, bag of pending events).  An apply step applies any pending
    event to the state (valid or not) and removes it from the bag; a compensation step repairs an
    invalid state once.  Under WFC (a potential that every repair step of an invalid state
    decreases), CC1 (normalized steps of independent events commute on valid states) and CC2
    (normalizing before an event changes nothing), the system terminates, is locally confluent and
    hence confluent with unique normal forms: every delivery order of the same pairwise-independent
    events, with compensation interleaved in any way, reaches the same valid state. *)

From Coq Require Import List Arith Lia Permutation.
From Govern Require Import Newman.
Import ListNotations.

Section Governance.
Variables (State Event : Type).
Variable event_eq_dec : forall x y : Event, {x = y} + {x <> y}.
Variable valid : State -> bool.
Variable rho : State -> State.             (** one compensation (repair) step *)
Variable apply : Event -> State -> State.  (** raw effect of an event *)
Variable indep : Event -> Event -> Prop.   (** declared independence *)

(** Compensation paths: from [s], repair while invalid, ending at [t]. *)
Inductive comp_path : State -> State -> Prop :=
| cp_done s : valid s = true -> comp_path s s
| cp_step s t : valid s = false -> comp_path (rho s) t -> comp_path s t.

(** The normal form function of the machine. *)
Variable nf : State -> State.

Hypothesis wfc : exists phi : State -> nat, forall s, valid s = false -> phi (rho s) < phi s.
Hypothesis nf_path : forall s, comp_path s (nf s).

Definition step (e : Event) (s : State) : State := nf (apply e s).

Hypothesis cc1 : forall a b s, indep a b -> valid s = true -> step b (step a s) = step a (step b s).
Hypothesis cc2 : forall e s, step e s = step e (nf s).

Fixpoint remove_one (e : Event) (l : list Event) : list Event :=
  match l with
  | [] => []
  | x :: t => if event_eq_dec e x then t else x :: remove_one e t
  end.

Definition conf : Type := (State * list Event)%type.

Inductive gstep : conf -> conf -> Prop :=
| g_apply s b e : In e b -> gstep (s, b) (apply e s, remove_one e b)
| g_comp s b : valid s = false -> gstep (s, b) (rho s, b).

(** Bags whose distinct events are pairwise independent. *)
Definition pw (b : list Event) : Prop := forall x y, In x b -> In y b -> x <> y -> indep x y.

(** The system on such bags. *)
Definition G (c d : conf) : Prop := gstep c d /\ pw (snd c).

(** ** Lists *)

Lemma remove_one_length e b : In e b -> S (length (remove_one e b)) = length b.
Proof.
  induction b as [|x t IH]; simpl; [tauto|]. destruct (event_eq_dec e x); simpl; auto.
  intros [->|H]; [congruence|]. rewrite IH; auto.
Qed.

Lemma remove_one_in x e b : In x (remove_one e b) -> In x b.
Proof. induction b as [|y t IH]; simpl; auto. destruct (event_eq_dec e y); simpl; intuition. Qed.

Lemma remove_one_keep x e b : In x b -> x <> e -> In x (remove_one e b).
Proof.
  induction b as [|y t IH]; simpl; auto. destruct (event_eq_dec e y); simpl.
  - intros [->|H] Hne; [congruence|auto].
  - intros [->|H] Hne; auto.
Qed.

Lemma remove_one_comm a c b : remove_one a (remove_one c b) = remove_one c (remove_one a b).
Proof.
  induction b as [|x t IH]; simpl; auto.
  destruct (event_eq_dec c x); destruct (event_eq_dec a x); subst; simpl;
  repeat match goal with |- context [event_eq_dec ?u ?v] => destruct (event_eq_dec u v) end; congruence.
Qed.

Lemma pw_remove e b : pw b -> pw (remove_one e b).
Proof. intros H x y Hx Hy. apply H; eapply remove_one_in; eauto. Qed.

Lemma perm_remove e l b : Permutation (e :: l) b -> In e b /\ Permutation l (remove_one e b).
Proof.
  intros H. assert (Hin : In e b) by (eapply Permutation_in; eauto; simpl; auto). split; auto.
  assert (Hb : Permutation b (e :: remove_one e b)).
  { clear H. induction b as [|x t IH]; simpl in *; [tauto|].
    destruct (event_eq_dec e x); subst; [apply Permutation_refl|].
    destruct Hin as [->|Hin]; [congruence|].
    eapply perm_trans; [apply perm_skip, IH; auto|]. apply perm_swap. }
  apply Permutation_cons_inv with (a := e). eapply perm_trans; eauto.
Qed.

(** ** Normal forms of repair *)

Lemma comp_path_det s t u : comp_path s t -> comp_path s u -> t = u.
Proof.
  intros H. revert u. induction H as [s Hv|s t Hv _ IH]; intros u Hu; inversion Hu; subst; auto; congruence.
Qed.

Lemma comp_path_valid s t : comp_path s t -> valid t = true.
Proof. induction 1; auto. Qed.

Lemma nf_valid s : valid (nf s) = true.
Proof. apply comp_path_valid with (s := s). apply nf_path. Qed.

Lemma nf_rho s : valid s = false -> nf (rho s) = nf s.
Proof.
  intros Hv. apply comp_path_det with (s := rho s); [apply nf_path|].
  pose proof (nf_path s) as H. inversion H; subst; [congruence|auto].
Qed.

Lemma nf_of_valid s : valid s = true -> nf s = s.
Proof. intros Hv. apply comp_path_det with (s := s); [apply nf_path|constructor; auto]. Qed.

Lemma star_comp s b : pw b -> star G (s, b) (nf s, b).
Proof.
  intros Hpw. pose proof (nf_path s) as H. remember (nf s) as t eqn:Et. clear Et.
  induction H as [s Hv|s t Hv _ IH]; [apply star_refl|].
  eapply star_step; [split; [apply g_comp; auto|exact Hpw]|exact IH].
Qed.

Lemma star_apply s b e : pw b -> In e b -> star G (s, b) (step e s, remove_one e b).
Proof.
  intros Hpw Hin. apply star_step with (y := (apply e s, remove_one e b)).
  - split; [apply g_apply; auto|exact Hpw].
  - unfold step. apply star_comp. apply pw_remove. exact Hpw.
Qed.

(** ** Termination *)

Theorem gov_terminating : forall c, SN G c.
Proof.
  destruct wfc as [phi Hphi].
  assert (H : forall k b, length b = k -> forall s, SN G (s, b)).
  { intros k. induction k as [k IHk] using lt_wf_ind.
    intros b Hb s. remember (phi s) as p eqn:Ep. revert s Ep.
    induction p as [p IHp] using lt_wf_ind. intros s Ep.
    constructor. intros [s' b'] [Hst _]. inversion Hst; subst.
    - apply (IHk (length (remove_one e b))); auto. rewrite <- (remove_one_length e b); auto.
    - apply (IHp (phi (rho s))); try reflexivity; subst; apply Hphi; auto. }
  intros [s b]. apply (H (length b)); auto.
Qed.

(** ** Local confluence *)

Theorem gov_locally_confluent : locally_confluent G.
Proof.
  intros [s b] c1 c2 [H1 Hpw] [H2 _]. simpl in Hpw.
  (* every branch: compensate both sides to normal form, then apply what is left *)
  inversion H1 as [? ? e1 Hin1|? ? Hv1]; inversion H2 as [? ? e2 Hin2|? ? Hv2]; subst.
  - destruct (event_eq_dec e1 e2) as [<-|Hne].
    + exists (apply e1 s, remove_one e1 b). split; apply star_refl.
    + exists (step e2 (step e1 s), remove_one e2 (remove_one e1 b)). split.
      * eapply star_trans; [apply star_comp, pw_remove; auto|].
        apply star_apply; [apply pw_remove; auto|apply remove_one_keep; auto].
      * replace (step e2 (step e1 s)) with (step e1 (step e2 s)).
        -- rewrite remove_one_comm.
           eapply star_trans; [apply star_comp, pw_remove; auto|].
           apply star_apply; [apply pw_remove; auto|apply remove_one_keep; auto].
        -- rewrite (cc2 e1 s), (cc2 e2 s). symmetry. apply cc1; [apply Hpw; auto|apply nf_valid].
  - exists (step e1 s, remove_one e1 b). split.
    + apply star_comp, pw_remove; auto.
    + eapply star_trans; [apply star_comp; auto|].
      replace (step e1 s) with (step e1 (nf (rho s))).
      * apply star_apply; auto.
      * rewrite nf_rho by auto. symmetry. apply cc2.
  - exists (step e2 s, remove_one e2 b). split.
    + eapply star_trans; [apply star_comp; auto|].
      replace (step e2 s) with (step e2 (nf (rho s))).
      * apply star_apply; auto.
      * rewrite nf_rho by auto. symmetry. apply cc2.
    + apply star_comp, pw_remove; auto.
  - exists (rho s, b). split; apply star_refl.
Qed.

Theorem gov_confluent : forall c, confluent_from G c.
Proof. apply (confluent_of_SN _ G); [apply gov_locally_confluent|apply gov_terminating]. Qed.

Lemma gov_normal s : valid s = true -> normal G (s, []).
Proof. intros Hv c [H _]. inversion H; subst; [contradiction|congruence]. Qed.

Theorem gov_unique_normal_forms : forall c s1 s2,
  star G c (s1, []) -> star G c (s2, []) -> valid s1 = true -> valid s2 = true -> s1 = s2.
Proof.
  intros c s1 s2 H1 H2 V1 V2.
  assert (E := unique_normal_forms _ G gov_locally_confluent c _ _ (gov_terminating c) H1 H2
                 (gov_normal s1 V1) (gov_normal s2 V2)).
  congruence.
Qed.

(** Every configuration over a pairwise-independent bag reaches a normal form (empty bag, valid state). *)
Lemma run_reaches es s b : pw b -> Permutation es b ->
  star G (s, b) (fold_left (fun t e => step e t) es (nf s), []).
Proof.
  revert s b. induction es as [|e es IH]; intros s b Hpw Hp; simpl.
  - apply Permutation_nil in Hp. subst. apply star_comp; auto.
  - destruct (perm_remove e es b Hp) as [Hin Hp'].
    assert (E : nf (step e (nf s)) = step e (nf s)) by (apply nf_of_valid, nf_valid).
    apply star_trans with (y := (nf s, b)); [apply star_comp; auto|].
    apply star_trans with (y := (step e (nf s), remove_one e b)); [apply star_apply; auto|].
    pose proof (IH (step e (nf s)) (remove_one e b) (pw_remove e b Hpw) Hp') as H.
    rewrite E in H. exact H.
Qed.

(** Stream convergence: any two delivery orders of the same pairwise-independent events, with
    compensation after each event (eager) or interleaved in any other way, reach the same valid
    state; it is the unique normal form of the configuration. *)
Theorem stream_convergence : forall s b es1 es2, pw b -> Permutation es1 b -> Permutation es2 b ->
  fold_left (fun t e => step e t) es1 (nf s) = fold_left (fun t e => step e t) es2 (nf s)
  /\ (forall t, star G (s, b) (t, []) -> valid t = true -> t = fold_left (fun t e => step e t) es1 (nf s)).
Proof.
  intros s b es1 es2 Hpw H1 H2.
  assert (V : forall es, valid (fold_left (fun t e => step e t) es (nf s)) = true).
  { intros es. generalize (nf s) (nf_valid s). induction es as [|e es IH]; intros t Ht; simpl; auto.
    apply IH. apply nf_valid. }
  split.
  - apply gov_unique_normal_forms with (c := (s, b)); auto using run_reaches.
  - intros t Ht Vt. apply gov_unique_normal_forms with (c := (s, b)); auto using run_reaches.
Qed.

End Governance.
