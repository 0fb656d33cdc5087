(** * Newman's lemma for an arbitrary relation.

    A locally confluent relation is confluent from every strongly normalizing element, and
    normal forms reachable from such an element are unique. *)

From Coq Require Import Relations.

Section Newman.
Variable A : Type.
Variable R : A -> A -> Prop.

(** Reflexive-transitive closure. *)
Inductive star : A -> A -> Prop :=
| star_refl x : star x x
| star_step x y z : R x y -> star y z -> star x z.

Lemma star_trans x y z : star x y -> star y z -> star x z.
Proof. induction 1; intros; auto. eapply star_step; eauto. Qed.

Lemma star_one x y : R x y -> star x y.
Proof. intros H. eapply star_step; eauto. apply star_refl. Qed.

Definition joinable (x y : A) : Prop := exists z, star x z /\ star y z.
Definition locally_confluent : Prop := forall a b c, R a b -> R a c -> joinable b c.
Definition confluent_from (a : A) : Prop := forall b c, star a b -> star a c -> joinable b c.
(** Strong normalization: no infinite R-chain starts at [a]. *)
Definition SN (a : A) : Prop := Acc (fun y x => R x y) a.
Definition normal (a : A) : Prop := forall b, ~ R a b.

Lemma SN_step a b : SN a -> R a b -> SN b.
Proof. intros [H] Hab. apply H. exact Hab. Qed.

Theorem newman : locally_confluent -> forall a, SN a -> confluent_from a.
Proof.
  intros LC a Hsn. induction Hsn as [a _ IH].
  intros b c Hb Hc.
  destruct Hb as [a|a b1 b Hab1 Hb1b].
  { exists c. split; [exact Hc|apply star_refl]. }
  destruct Hc as [a|a c1 c Hac1 Hc1c].
  { exists b. split; [apply star_refl|eapply star_step; eauto]. }
  destruct (LC a b1 c1 Hab1 Hac1) as [d [Hb1d Hc1d]].
  destruct (IH b1 Hab1 b d Hb1b Hb1d) as [e [Hbe Hde]].
  destruct (IH c1 Hac1 e c (star_trans _ _ _ Hc1d Hde) Hc1c) as [f [Hef Hcf]].
  exists f. split; [eapply star_trans; eauto|exact Hcf].
Qed.

Theorem confluent_of_SN : locally_confluent -> (forall a, SN a) -> forall a, confluent_from a.
Proof. intros LC H a. apply newman; auto. Qed.

Lemma star_normal a b : normal a -> star a b -> a = b.
Proof. intros Hn H. destruct H as [|x y z Hxy _]; auto. destruct (Hn y Hxy). Qed.

Theorem unique_normal_forms : locally_confluent ->
  forall a b c, SN a -> star a b -> star a c -> normal b -> normal c -> b = c.
Proof.
  intros LC a b c Hsn Hb Hc Nb Nc.
  destruct (newman LC a Hsn b c Hb Hc) as [z [Hbz Hcz]].
  rewrite (star_normal b z Nb Hbz), (star_normal c z Nc Hcz). reflexivity.
Qed.

End Newman.

Arguments star {A} R _ _.
Arguments joinable {A} R _ _.
Arguments locally_confluent {A} R.
Arguments confluent_from {A} R _.
Arguments SN {A} R _.
Arguments normal {A} R _.
