(** * The delivery rules: obligations, idempotence, duplicates and delivery orders.

    A certified table verdict also carries two lists the runtime orders and deduplicates events
    by: [v_obligations], the pairs [a < b] of events that do not commute somewhere on the checked
    domain D, and [v_not_idem], the events whose second application changes some state of D.
    [check_tables_delivery] proves both lists exactly right on D.  [check_tables_replica] proves
    that a replica delivering a log in any order that keeps every obligation pair in log order
    (each log position at least once, a position delivered more than once only when its event is
    not in [v_not_idem]) reaches the state the log order reaches.  [check_tables_duplicate] is the
    at-least-once theorem: a duplicate is absorbed when its event is idempotent and no obligation
    partner of it lands between the two copies, and both conditions are needed. *)

From Coq Require Import List Arith Bool Lia ListDec.
From Govern Require Import Vec TableCheck.
Import ListNotations.

(** ** Delivery orders over an abstract step function *)

(** [hd_all c d]: every entry [j] of [d] satisfies [c j w], [w] the entries after it. *)
Fixpoint hd_all (c : nat -> list nat -> Prop) (d : list nat) : Prop :=
  match d with [] => True | j :: w => c j w /\ hd_all c w end.

Lemma hd_all_suffix (c : nat -> list nat -> Prop) u w : hd_all c (u ++ w) -> hd_all c w.
Proof. induction u as [|x u IH]; simpl; [auto|]. intros [_ H]. auto. Qed.

Lemma hd_all_remove (c : nat -> list nat -> Prop) (Hc : forall j w w', incl w' w -> c j w -> c j w') u x w :
  hd_all c (u ++ x :: w) -> hd_all c (u ++ w).
Proof.
  induction u as [|y u IH]; simpl; intros H; [apply H|].
  destruct H as [H1 H2]. split; [|apply IH; auto].
  apply (Hc y (u ++ x :: w)); auto. intros z Hz. apply in_app_or in Hz. apply in_or_app. simpl. tauto.
Qed.

Lemma first_occ (x : nat) t : In x t -> exists a b, t = a ++ x :: b /\ ~ In x a.
Proof.
  induction t as [|y t IH]; intros H; [destruct H|].
  destruct (Nat.eq_dec y x) as [->|Hne].
  - exists [], t. auto.
  - destruct H as [H|H]; [congruence|]. destruct (IH H) as [a [b [-> Ha]]].
    exists (y :: a), b. split; [reflexivity|]. intros [H'|H']; auto.
Qed.

Lemma find_dup (d : list nat) : ~ NoDup d -> exists u i m w, d = u ++ i :: m ++ i :: w /\ ~ In i m.
Proof.
  induction d as [|x t IH]; intros H; [exfalso; apply H; constructor|].
  destruct (in_dec Nat.eq_dec x t) as [Hx|Hx].
  - destruct (first_occ x t Hx) as [a [b [-> Ha]]]. exists [], x, a, b. auto.
  - assert (Ht : ~ NoDup t) by (intros Hn; apply H; constructor; auto).
    destruct (IH Ht) as [u [i [m [w [-> Hm]]]]]. exists (x :: u), i, m, w. auto.
Qed.

Section Orders.
(** [step e s] is the state after event [e] at [s]; [dom] a set of states closed under the steps of
    the events [ok]; two events commute on [dom] unless they are in conflict ([conf], either way
    round); an event [idem] is idempotent on [dom]. *)
Variable step : nat -> nat -> nat.
Variable dom : nat -> Prop.
Variable ok : nat -> Prop.
Variable conf : nat -> nat -> Prop.
Variable idem : nat -> Prop.
Hypothesis closed : forall e s, ok e -> dom s -> dom (step e s).
Hypothesis commute : forall a b s, ok a -> ok b -> ~ conf a b -> ~ conf b a -> dom s ->
  step b (step a s) = step a (step b s).
Hypothesis idem_ok : forall e s, ok e -> idem e -> dom s -> step e (step e s) = step e s.

Definition runs (es : list nat) (s : nat) : nat := fold_left (fun s e => step e s) es s.

Lemma runs_app u w s : runs (u ++ w) s = runs w (runs u s).
Proof. unfold runs. apply fold_left_app. Qed.

Lemma runs_cons e es s : runs (e :: es) s = runs es (step e s).
Proof. reflexivity. Qed.

Lemma runs_dom es : forall s, Forall ok es -> dom s -> dom (runs es s).
Proof.
  induction es as [|e es IH]; intros s H Hs; [exact Hs|].
  inversion H; subst. rewrite runs_cons. apply IH; auto.
Qed.

Lemma move_right x w t : ok x -> dom t -> Forall (fun y => ok y /\ ~ conf x y /\ ~ conf y x) w ->
  runs (x :: w) t = runs (w ++ [x]) t.
Proof.
  revert t; induction w as [|y w IH]; intros t Hx Ht Hw; [reflexivity|].
  inversion Hw as [|? ? [Hy [H1 H2]] Hw']; subst.
  rewrite runs_cons, runs_cons. rewrite (commute x y t) by auto.
  specialize (IH (step y t) Hx (closed y t Hy Ht) Hw'). rewrite runs_cons in IH.
  rewrite IH. reflexivity.
Qed.

(** A second copy of an idempotent [x] is absorbed when [x] commutes with everything between. *)
Lemma absorb x m t : ok x -> idem x -> dom t -> Forall (fun y => ok y /\ ~ conf x y /\ ~ conf y x) m ->
  runs (x :: m ++ [x]) t = runs (x :: m) t.
Proof.
  intros Hx Hi Ht Hm. rewrite runs_cons. rewrite <- move_right by (auto; apply closed; auto).
  rewrite runs_cons, idem_ok by auto. reflexivity.
Qed.

(** Delivery of log positions: [ev i] is the event at log position [i]. *)
Variable ev : nat -> nat.

(** When position [i] (earlier in the log) is delivered after position [j], the two events are in
    no conflict. *)
Definition keeps_order (d : list nat) : Prop :=
  hd_all (fun j w => forall i, In i w -> i < j -> ~ conf (ev i) (ev j) /\ ~ conf (ev j) (ev i)) d.

(** A position delivered more than once holds an idempotent event. *)
Definition dups_idem (d : list nat) : Prop := hd_all (fun i w => In i w -> idem (ev i)) d.

Lemma keeps_order_remove u x w : keeps_order (u ++ x :: w) -> keeps_order (u ++ w).
Proof. apply hd_all_remove. intros j w1 w2 Hi H i Hin. apply H. apply Hi. exact Hin. Qed.

Lemma dups_idem_remove u x w : dups_idem (u ++ x :: w) -> dups_idem (u ++ w).
Proof. apply hd_all_remove. intros j w1 w2 Hi H Hin. apply H. apply Hi. exact Hin. Qed.

Lemma forall_map_ev l (P : nat -> Prop) : (forall i, In i l -> P (ev i)) -> Forall P (map ev l).
Proof. intros H. apply Forall_forall. intros x Hx. apply in_map_iff in Hx as [i [<- Hi]]. auto. Qed.

(** Every position exactly once, obligation pairs in log order: the log-order state. *)
Lemma deliver_once k : forall d s, NoDup d -> (forall i, In i d <-> i < k) -> (forall i, i < k -> ok (ev i)) ->
  keeps_order d -> dom s -> runs (map ev d) s = runs (map ev (seq 0 k)) s.
Proof.
  induction k as [|k IH]; intros d s Hnd Hin Hok Hko Hs.
  - destruct d as [|x d]; [reflexivity|]. exfalso. specialize (proj1 (Hin x) (or_introl eq_refl)). lia.
  - assert (Hk : In k d) by (apply Hin; lia).
    destruct (in_split _ _ Hk) as [d1 [d2 ->]].
    assert (Hnk : ~ In k (d1 ++ d2)) by (apply NoDup_remove_2; auto).
    assert (Hlt : forall i, In i (d1 ++ d2) -> i < k).
    { intros i Hi. assert (H1 : i < S k) by (apply Hin; apply in_app_or in Hi; apply in_or_app; simpl; tauto).
      assert (H2 : i <> k) by (intros ->; auto). lia. }
    assert (Hd2 : forall i, In i d2 -> i < k) by (intros i Hi; apply Hlt; apply in_or_app; auto).
    assert (Hc : forall i, In i d2 -> i < k -> ~ conf (ev i) (ev k) /\ ~ conf (ev k) (ev i)).
    { apply hd_all_suffix in Hko. apply Hko. }
    assert (Hd1 : Forall ok (map ev d1)).
    { apply forall_map_ev. intros i Hi. apply Hok. cut (i < k); [lia|]. apply Hlt. apply in_or_app. auto. }
    rewrite map_app, runs_app. cbn [map]. rewrite move_right.
    2: apply Hok; lia.
    2: apply runs_dom; auto.
    2: { apply forall_map_ev. intros i Hi. split; [apply Hok; specialize (Hd2 i Hi); lia|].
         destruct (Hc i Hi (Hd2 i Hi)). auto. }
    rewrite runs_app, <- (runs_app (map ev d1) (map ev d2)), <- map_app.
    rewrite (IH (d1 ++ d2)); auto.
    + rewrite seq_S, map_app. rewrite (runs_app _ (map ev [0 + k])). reflexivity.
    + apply NoDup_remove_1 with (a := k). exact Hnd.
    + intros i. split; [apply Hlt|]. intros Hi.
      assert (Hi' : In i (d1 ++ k :: d2)) by (apply Hin; lia).
      apply in_app_or in Hi'. apply in_or_app. destruct Hi' as [H|[H|H]]; auto. lia.
    + apply keeps_order_remove in Hko. exact Hko.
Qed.

(** Every position at least once, obligation pairs in log order (every copy), duplicates only of
    idempotent events: the log-order state. *)
Lemma deliver_dups k n : forall d s, length d <= n -> (forall i, In i d <-> i < k) ->
  (forall i, i < k -> ok (ev i)) -> keeps_order d -> dups_idem d -> dom s ->
  runs (map ev d) s = runs (map ev (seq 0 k)) s.
Proof.
  induction n as [|n IH]; intros d s Hl Hin Hok Hko Hdi Hs.
  - destruct d; [|simpl in Hl; lia]. apply deliver_once; auto. constructor.
  - destruct (NoDup_dec Nat.eq_dec d) as [Hnd|Hnd]; [apply deliver_once; auto|].
    destruct (find_dup d Hnd) as [u [i [m [w [-> Hm]]]]].
    assert (Hlt : forall j, In j (u ++ i :: m ++ i :: w) -> ok (ev j)).
    { intros j Hj. apply Hok. apply Hin. exact Hj. }
    assert (Hsuf : keeps_order (i :: m ++ i :: w)) by (apply hd_all_suffix in Hko; exact Hko).
    assert (Hmc : forall j, In j m -> ok (ev j) /\ ~ conf (ev i) (ev j) /\ ~ conf (ev j) (ev i)).
    { intros j Hj. split; [apply Hlt; apply in_or_app; right; right; apply in_or_app; auto|].
      destruct (Nat.lt_total j i) as [Hji|[->|Hij]].
      - destruct Hsuf as [Hc _]. destruct (Hc j (in_or_app _ _ _ (or_introl Hj)) Hji). auto.
      - contradiction.
      - destruct (in_split _ _ Hj) as [m1 [m2 ->]].
        assert (Hk2 : keeps_order (j :: m2 ++ i :: w)).
        { assert (E : u ++ i :: (m1 ++ j :: m2) ++ i :: w = (u ++ i :: m1) ++ j :: m2 ++ i :: w)
            by (rewrite <- app_assoc; simpl; rewrite <- app_assoc; reflexivity).
          rewrite E in Hko. apply hd_all_suffix in Hko. exact Hko. }
        destruct Hk2 as [Hc _]. destruct (Hc i (in_or_app _ _ _ (or_intror (or_introl eq_refl : In i (i :: w)))) Hij).
        auto. }
    assert (Hid : idem (ev i)).
    { apply hd_all_suffix in Hdi. destruct Hdi as [Hc _]. apply Hc. apply in_or_app. right. left. auto. }
    assert (Hrm : runs (map ev (u ++ i :: m ++ i :: w)) s = runs (map ev (u ++ i :: m ++ w)) s).
    { set (t := runs (map ev u) s).
      assert (A : runs (ev i :: map ev m ++ [ev i]) t = runs (ev i :: map ev m) t).
      { apply absorb.
        - apply Hlt. apply in_or_app. right. left. auto.
        - exact Hid.
        - apply runs_dom; auto. apply forall_map_ev. intros j Hj. apply Hlt. apply in_or_app. auto.
        - apply forall_map_ev. exact Hmc. }
      assert (L1 : map ev (u ++ i :: m ++ i :: w) = map ev u ++ (ev i :: map ev m ++ [ev i]) ++ map ev w).
      { rewrite !map_app. simpl. rewrite !map_app, <- !app_assoc. reflexivity. }
      assert (L2 : map ev (u ++ i :: m ++ w) = map ev u ++ (ev i :: map ev m) ++ map ev w).
      { rewrite !map_app. simpl. rewrite !map_app. reflexivity. }
      rewrite L1, L2, !runs_app. fold t. rewrite A. reflexivity. }
    rewrite Hrm.
    assert (Hshape : u ++ i :: m ++ i :: w = (u ++ i :: m) ++ i :: w) by (rewrite <- app_assoc; reflexivity).
    apply IH; auto.
    + rewrite Hshape in Hl. rewrite app_length in *. simpl in *. rewrite app_length in *. simpl in *. lia.
    + intros j. rewrite <- Hin. split; intros Hj.
      * apply in_app_or in Hj. apply in_or_app. destruct Hj as [Hj|[Hj|Hj]]; [auto|right; left; auto|].
        apply in_app_or in Hj. right. right. apply in_or_app. destruct Hj; [auto|right; right; auto].
      * apply in_app_or in Hj. apply in_or_app. destruct Hj as [Hj|[Hj|Hj]]; [auto|right; left; auto|].
        apply in_app_or in Hj. destruct Hj as [Hj|[Hj|Hj]].
        -- right. right. apply in_or_app. auto.
        -- right. left. auto.
        -- right. right. apply in_or_app. auto.
    + rewrite Hshape in Hko. apply keeps_order_remove in Hko. rewrite <- app_assoc in Hko. exact Hko.
    + rewrite Hshape in Hdi. apply dups_idem_remove in Hdi. rewrite <- app_assoc in Hdi. exact Hdi.
Qed.

End Orders.

Lemma hd_all_of (c : nat -> list nat -> Prop) d :
  (forall u j w, d = u ++ j :: w -> c j w) -> hd_all c d.
Proof.
  induction d as [|j w IH]; intros H; simpl; [exact I|]. split.
  - apply (H []). reflexivity.
  - apply IH. intros u x w' E. apply (H (j :: u)). rewrite E. reflexivity.
Qed.

Lemma map_nth_seq (l : list nat) : map (fun i => nth i l 0) (seq 0 (length l)) = l.
Proof.
  induction l as [|x l IH]; [reflexivity|]. cbn [length seq map]. rewrite <- seq_shift, map_map.
  cbn [nth]. rewrite IH. reflexivity.
Qed.

(** ** The checker's delivery lists *)

Lemma in_obl_loop steps stepsD ps acc p :
  In p (obl_loop steps stepsD ps acc) <->
  In p acc \/ (In p ps /\ vgeq (nth (snd p) steps dflt) (nth (fst p) stepsD dflt)
                               (nth (fst p) steps dflt) (nth (snd p) stepsD dflt) = false).
Proof.
  revert acc; induction ps as [|q ps IH]; intros acc; simpl; [tauto|].
  rewrite IH.
  destruct (vgeq (nth (snd q) steps dflt) (nth (fst q) stepsD dflt) (nth (fst q) steps dflt)
                 (nth (snd q) stepsD dflt)) eqn:Hq; simpl; split.
  - intros [H|[H1 H2]]; auto.
  - intros [H|[[<-|H1] H2]]; auto. congruence.
  - intros [[<-|H]|[H1 H2]]; auto.
  - intros [H|[[<-|H1] H2]]; auto.
Qed.

Lemma in_idem_loop steps stepsD didx es acc e :
  In e (idem_loop steps stepsD didx es acc) <->
  In e acc \/ (In e es /\ vgeq (nth e steps dflt) (nth e stepsD dflt) (nth e steps dflt) didx = false).
Proof.
  revert acc; induction es as [|x es IH]; intros acc; simpl; [tauto|].
  rewrite IH.
  destruct (vgeq (nth x steps dflt) (nth x stepsD dflt) (nth x steps dflt) didx) eqn:Hq; simpl; split.
  - intros [H|[H1 H2]]; auto.
  - intros [H|[[<-|H1] H2]]; auto. congruence.
  - intros [[<-|H]|[H1 H2]]; auto.
  - intros [H|[[<-|H1] H2]]; auto.
Qed.

(** The checked domain of [check_tables_sound], as one predicate: it holds the initial state,
    consists of valid states, holds every valid state when the domain is "valid", is closed under
    every normalized step, and every checked pair commutes on it. *)
Definition domain_spec (valid : mask) (apply : list vec) (pairs : option (list (nat * nat))) (reach : bool)
    (init : nat) (nf : vec) (dom : nat -> Prop) : Prop :=
  dom init
  /\ (forall s, dom s -> s < mlen valid /\ mnth valid s = true)
  /\ (reach = false -> forall s, s < mlen valid -> mnth valid s = true -> dom s)
  /\ (forall e s, e < nevents apply -> dom s -> dom (nstep apply nf e s))
  /\ (forall a b s, checked pairs (nevents apply) a b -> dom s ->
        nstep apply nf b (nstep apply nf a s) = nstep apply nf a (nstep apply nf b s)).

(** (c) The obligations and the not-idempotent events of a certified verdict are exactly right on
    the checked domain: a pair [a < b] is an obligation exactly when the two events fail to commute
    at some state of the domain, and an event is listed as not idempotent exactly when applying it
    twice differs from applying it once at some state of the domain.  Every pair outside the
    obligations therefore commutes on the domain, every event outside the list is idempotent on it.
    ([check_tables_w] gives the same verdict, lists included: [check_tables_w_eq].) *)
Theorem check_tables_delivery valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  let nf := v_nf v in
  WFC valid repair /\ IsNF valid repair nf /\ mnth valid init = true /\
  exists dom : nat -> Prop,
    domain_spec valid apply pairs reach init nf dom
    /\ (forall a b, In (a, b) (v_obligations v) <->
          a < b /\ b < nevents apply
          /\ exists s, dom s /\ nstep apply nf b (nstep apply nf a s) <> nstep apply nf a (nstep apply nf b s))
    /\ (forall e, In e (v_not_idem v) <->
          e < nevents apply /\ exists s, dom s /\ nstep apply nf e (nstep apply nf e s) <> nstep apply nf e s).
Proof.
  cbv zeta. unfold check_tables, check_from_nf.
  destruct (well_formed valid repair apply pairs init) eqn:WF; cbn [negb v_certified]; [|discriminate].
  destruct (nf_result valid repair) as [[wfc F] D] eqn:HN.
  destruct wfc; cbn [negb v_certified]; [|discriminate].
  destruct (pos_ok (vrank valid) (mwhere valid)) eqn:HP; cbn [negb v_certified]; [|discriminate].
  destruct (mnth valid init) eqn:Hinit; cbn [negb v_certified]; [|discriminate].
  set (V := mwhere valid) in *.
  set (P := vrank valid) in *.
  set (XV := tmap (fun a => vgather F (vgather a V)) apply) in *.
  set (PV := tmap (fun xv => vgather P xv) XV) in *.
  set (dm := domain_mask (vlen V) PV reach (vnth P init)) in *.
  destruct (dom_ok (vlen V) PV dm (vnth P init)) eqn:Hdom; cbn [negb v_certified]; [|discriminate].
  set (ps := match pairs with None => all_pairs (tlen apply) | Some ps => ps end) in *.
  set (didx := mwhere dm) in *.
  set (PVD := tmap (fun st => vgather st didx) PV) in *.
  destruct (cc1_loop PV PVD (vgather V didx) ps) eqn:Hloop;
    cbn [v_certified v_nf v_obligations v_not_idem]; [discriminate|].
  intros _.
  destruct (nf_facts valid repair apply pairs init WF true F D HN eq_refl) as [Hwfc Hnf].
  destruct (dom_ok_spec valid repair apply pairs init WF F Hnf P HP dm (vnth P init) Hdom) as (Hl & Hi & Hcl).
  pose proof (wf_parts valid repair apply pairs init WF) as (Hin & _ & _ & _ & _ & Hps).
  pose proof (P_lt valid repair apply pairs init WF F Hnf P HP) as HPl.
  pose proof (PV_val valid repair apply pairs init WF F Hnf P HP) as HPV.
  pose proof (PV_two valid repair apply pairs init WF F Hnf P HP) as HP2.
  pose proof (V_facts valid repair apply pairs init WF F Hnf P HP) as HVf.
  pose proof (V_inj valid repair apply pairs init WF F Hnf P HP) as HVi.
  pose proof (PV_len valid repair apply pairs init WF F Hnf P HP) as HPVl.
  fold V XV PV in HPV, HP2, HPVl. fold V in Hl, HPl, HVf, HVi.
  assert (Hchk : forall a b, checked pairs (nevents apply) a b -> In (a, b) ps /\ a < nevents apply /\ b < nevents apply).
  { intros a b. unfold checked, ps. destruct pairs as [l|].
    - intros H. destruct (Hps l eq_refl a b H) as (H1 & H2 & _). auto.
    - rewrite in_all_pairs, tlen_length. intros H. unfold nevents in *. repeat split; lia. }
  set (dom := fun s => exists j, j < vlen V /\ mnth dm j = true /\ s = vnth V j).
  assert (HD : forall e, e < nevents apply -> nth e PVD dflt = vgather (nth e PV dflt) didx).
  { intros e He. unfold PVD. rewrite tmap_map. rewrite (nth_map_lt _ _ _ _ dflt); [reflexivity|].
    rewrite HPVl. auto. }
  assert (HDl : forall e, e < nevents apply -> vlen (nth e PVD dflt) = vlen didx).
  { intros e He. rewrite HD, vlen_vgather; auto. }
  assert (Hdidx : forall k, k < vlen didx -> vnth didx k < vlen V /\ mnth dm (vnth didx k) = true).
  { intros k Hk. destruct (vnth_mwhere dm k Hk) as [H1 H2]. rewrite <- Hl. auto. }
  assert (Hcover : forall j, j < vlen V -> mnth dm j = true -> exists k, k < vlen didx /\ vnth didx k = j).
  { intros j Hj Hd. apply mwhere_cover; auto. rewrite Hl. auto. }
  (* the domain, its closure and CC1 on it, as in check_tables_sound *)
  assert (Hspec : domain_spec valid apply pairs reach init F dom).
  { destruct (HPl init Hin Hinit) as [Hpi Epi].
    split; [exists (vnth P init); auto|].
    split; [intros s [j (Hj & Hd & ->)]; apply HVf; auto|].
    split.
    { intros Hr s Hs Hv. destruct (HPl s Hs Hv) as [Hp Ep]. exists (vnth P s).
      split; [exact Hp|]. split; [|symmetry; exact Ep].
      subst dm. unfold domain_mask. rewrite Hr.
      rewrite mnth_veq by (rewrite ?vlen_viota; auto). apply Nat.eqb_refl. }
    split.
    { intros e s He [j (Hj & Hd & ->)]. destruct (HPV e j He Hj) as [Hlt Ev].
      exists (vnth (nth e PV dflt) j). split; [exact Hlt|]. split; [apply Hcl; auto|symmetry; exact Ev]. }
    intros a b s H [j (Hj & Hd & ->)]. destruct (Hchk a b H) as (Hab & Ha & Hb).
    destruct (HP2 a b j Ha Hb Hj) as [_ E1]. destruct (HP2 b a j Hb Ha Hj) as [_ E2].
    etransitivity; [exact E1|]. etransitivity; [|symmetry; exact E2]. f_equal.
    apply (cc1_loop_spec valid repair apply pairs init WF F Hnf P HP dm (vgather V didx) ps); auto.
    intros x y Hxy. unfold ps in Hxy. destruct pairs as [l|].
    - destruct (Hps l eq_refl x y Hxy) as (H1 & H2 & _). auto.
    - rewrite in_all_pairs, tlen_length in Hxy. unfold nevents. lia. }
  (* a pair commutes at a domain state exactly when it commutes at its position *)
  assert (Hst2 : forall a b j, a < nevents apply -> b < nevents apply -> j < vlen V ->
    (vnth (nth b PV dflt) (vnth (nth a PV dflt) j) = vnth (nth a PV dflt) (vnth (nth b PV dflt) j)
     <-> nstep apply F b (nstep apply F a (vnth V j)) = nstep apply F a (nstep apply F b (vnth V j)))).
  { intros a b j Ha Hb Hj. destruct (HP2 a b j Ha Hb Hj) as [L1 E1]. destruct (HP2 b a j Hb Ha Hj) as [L2 E2].
    rewrite E1, E2. split; [intros ->; reflexivity|]. intros E. apply HVi; auto. }
  assert (Hst1 : forall e j, e < nevents apply -> j < vlen V ->
    (vnth (nth e PV dflt) (vnth (nth e PV dflt) j) = vnth (nth e PV dflt) j
     <-> nstep apply F e (nstep apply F e (vnth V j)) = nstep apply F e (vnth V j))).
  { intros e j He Hj. destruct (HP2 e e j He He Hj) as [L1 E1]. destruct (HPV e j He Hj) as [L2 E2].
    rewrite E1, <- E2. split; [intros ->; reflexivity|]. intros E. apply HVi; auto. }
  assert (Hvg2 : forall a b, a < nevents apply -> b < nevents apply ->
    (vgeq (nth b PV dflt) (nth a PVD dflt) (nth a PV dflt) (nth b PVD dflt) = true
     <-> forall s, dom s -> nstep apply F b (nstep apply F a s) = nstep apply F a (nstep apply F b s))).
  { intros a b Ha Hb. rewrite vgeq_spec by (rewrite !HDl; auto). rewrite HDl by auto. split.
    - intros H s [j (Hj & Hd & ->)]. destruct (Hcover j Hj Hd) as [k [Hk <-]].
      specialize (H k Hk). rewrite !HD, !vnth_vgather in H by auto. apply Hst2; auto.
    - intros H k Hk. destruct (Hdidx k Hk) as [Hj Hd]. rewrite !HD, !vnth_vgather by auto.
      apply Hst2; auto. apply H. exists (vnth didx k). auto. }
  assert (Hvg1 : forall e, e < nevents apply ->
    (vgeq (nth e PV dflt) (nth e PVD dflt) (nth e PV dflt) didx = true
     <-> forall s, dom s -> nstep apply F e (nstep apply F e s) = nstep apply F e s)).
  { intros e He. rewrite vgeq_spec by (rewrite !HDl; auto). rewrite HDl by auto. split.
    - intros H s [j (Hj & Hd & ->)]. destruct (Hcover j Hj Hd) as [k [Hk <-]].
      specialize (H k Hk). rewrite !HD, !vnth_vgather in H by auto. apply Hst1; auto.
    - intros H k Hk. destruct (Hdidx k Hk) as [Hj Hd]. rewrite !HD, !vnth_vgather by auto.
      apply Hst1; auto. apply H. exists (vnth didx k). auto. }
  (* "not everywhere" is "somewhere", on the finitely many positions of the domain *)
  assert (Hsome : forall (R : nat -> Prop), (forall s, {R s} + {~ R s}) ->
    ~ (forall s, dom s -> R s) -> exists s, dom s /\ ~ R s).
  { intros R Rd H. destruct (bounded_dec (fun k => ~ R (vnth V (vnth didx k)))
      (fun k => match Rd (vnth V (vnth didx k)) with left h => right (fun c => c h) | right h => left h end)
      (vlen didx)) as [[k [Hk Hr]]|Hall].
    - exists (vnth V (vnth didx k)). split; [|exact Hr]. exists (vnth didx k). destruct (Hdidx k Hk). auto.
    - exfalso. apply H. intros s [j (Hj & Hd & ->)]. destruct (Hcover j Hj Hd) as [k [Hk <-]].
      destruct (Rd (vnth V (vnth didx k))) as [r|r]; [exact r|]. exfalso. exact (Hall k Hk r). }
  split; [exact Hwfc|]. split; [exact Hnf|]. split; [reflexivity|].
  exists dom. split; [exact Hspec|]. split.
  - intros a b. destruct pairs as [l|] eqn:Hpairs.
    + rewrite in_obl_loop. cbn [fst snd In]. rewrite in_all_pairs, tlen_length. split.
      * intros [[]|[[Hab Hb] Hv]]. split; [exact Hab|]. split; [exact Hb|].
        apply Hsome; [intros s; apply Nat.eq_dec|]. intros H. rewrite <- Hvg2 in H by (unfold nevents; lia).
        congruence.
      * intros (Hab & Hb & s & Hs & Hne). right. split; [split; auto|].
        destruct (vgeq _ _ _ _) eqn:Hv; [|reflexivity]. exfalso. apply Hne.
        apply (proj1 (Hvg2 a b ltac:(unfold nevents in *; lia) Hb) Hv s Hs).
    + cbn [In]. split; [intros []|]. intros (Hab & Hb & s & Hs & Hne). apply Hne.
      destruct Hspec as (_ & _ & _ & _ & Hcc). apply Hcc; auto. cbn. lia.
  - intros e. rewrite in_idem_loop, in_desc, tlen_length. cbn [In]. split.
    + intros [[]|[He Hv]]. split; [exact He|]. apply Hsome; [intros s; apply Nat.eq_dec|].
      intros H. rewrite <- Hvg1 in H by exact He. congruence.
    + intros (He & s & Hs & Hne). right. split; [exact He|].
      destruct (vgeq _ _ _ _) eqn:Hv; [|reflexivity]. exfalso. apply Hne.
      apply (proj1 (Hvg1 e He) Hv s Hs).
Qed.

(** Events [a] and [b] form an obligation pair of the verdict (either way round). *)
Definition obligation (v : verdict) (a b : nat) : Prop := In (a, b) (v_obligations v) \/ In (b, a) (v_obligations v).

(** The hypotheses of [Orders] for a certified verdict, from (c). *)
Lemma delivery_hyps valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  let nf := v_nf v in
  exists dom : nat -> Prop,
    domain_spec valid apply pairs reach init nf dom
    /\ (forall a b s, a < nevents apply -> b < nevents apply -> ~ In (a, b) (v_obligations v) ->
          ~ In (b, a) (v_obligations v) -> dom s ->
          nstep apply nf b (nstep apply nf a s) = nstep apply nf a (nstep apply nf b s))
    /\ (forall e s, e < nevents apply -> ~ In e (v_not_idem v) -> dom s ->
          nstep apply nf e (nstep apply nf e s) = nstep apply nf e s)
    /\ (forall a b, In (a, b) (v_obligations v) ->
          exists s, dom s /\ nstep apply nf b (nstep apply nf a s) <> nstep apply nf a (nstep apply nf b s))
    /\ (forall e, In e (v_not_idem v) -> exists s, dom s /\ nstep apply nf e (nstep apply nf e s) <> nstep apply nf e s).
Proof.
  intros v Hc nf. destruct (check_tables_delivery valid repair apply pairs reach init Hc)
    as (_ & _ & _ & dom & Hspec & Hobl & Hidem).
  exists dom. split; [exact Hspec|]. split; [|split; [|split]].
  - intros a b s Ha Hb Hab Hba Hs.
    destruct (Nat.lt_total a b) as [Hlt|[->|Hlt]]; [| reflexivity |].
    + destruct (Nat.eq_dec (nstep apply nf b (nstep apply nf a s)) (nstep apply nf a (nstep apply nf b s)))
        as [E|E]; [exact E|]. exfalso. apply Hab. apply Hobl. split; [exact Hlt|]. split; [exact Hb|].
      exists s. auto.
    + destruct (Nat.eq_dec (nstep apply nf a (nstep apply nf b s)) (nstep apply nf b (nstep apply nf a s)))
        as [E|E]; [symmetry; exact E|]. exfalso. apply Hba. apply Hobl. split; [exact Hlt|]. split; [exact Ha|].
      exists s. auto.
  - intros e s He Hn Hs.
    destruct (Nat.eq_dec (nstep apply nf e (nstep apply nf e s)) (nstep apply nf e s)) as [E|E]; [exact E|].
    exfalso. apply Hn. apply Hidem. split; [exact He|]. exists s. auto.
  - intros a b H. apply Hobl in H. apply H.
  - intros e H. apply Hidem in H. apply H.
Qed.

(** (b) A replica reaches the log-order state.  The log is a list of events; the replica delivers
    the list [d] of log positions: every position at least once; whenever a position [i] is
    delivered after a later position [j] ([i < j]), their events are not an obligation pair; a
    position is delivered more than once only when its event is not in [v_not_idem].  From any
    state of the checked domain, applying the delivered events in delivery order (normalizing after
    each, as [Machine.apply] does) reaches the state the log order reaches.  Delivering every position
    exactly once (what [Replica] does: it drops every duplicate by log position) is the special case
    where no position repeats. *)
Theorem check_tables_replica valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  let nf := v_nf v in
  exists dom : nat -> Prop,
    domain_spec valid apply pairs reach init nf dom
    /\ forall (log d : list nat) s,
         dom s ->
         Forall (fun e => e < nevents apply) log ->
         (forall i, In i d <-> i < length log) ->
         (forall u j w i, d = u ++ j :: w -> In i w -> i < j -> ~ obligation v (nth i log 0) (nth j log 0)) ->
         (forall u i w, d = u ++ i :: w -> In i w -> ~ In (nth i log 0) (v_not_idem v)) ->
         run apply nf (map (fun i => nth i log 0) d) s = run apply nf log s.
Proof.
  intros v Hc nf. destruct (delivery_hyps valid repair apply pairs reach init Hc)
    as (dom & Hspec & Hcomm & Hid & _ & _).
  exists dom. split; [exact Hspec|]. intros log d s Hs Hlog Hin Hord Hdup.
  destruct Hspec as (_ & _ & _ & Hcl & _).
  rewrite !run_fold.
  assert (Elog : fold_left (fun s e => nstep apply nf e s) log s
              = fold_left (fun s e => nstep apply nf e s) (map (fun i => nth i log 0) (seq 0 (length log))) s)
    by (rewrite map_nth_seq; reflexivity).
  rewrite Elog.
  apply (deliver_dups (nstep apply nf) dom (fun e => e < nevents apply) (fun a b => In (a, b) (v_obligations v))
           (fun e => ~ In e (v_not_idem v)) Hcl Hcomm Hid (fun i => nth i log 0) (length log) (length d)); auto.
  - intros i Hi. rewrite Forall_forall in Hlog. apply Hlog. apply nth_In. exact Hi.
  - apply hd_all_of. intros u j w E i Hi Hij. specialize (Hord u j w i E Hi Hij). unfold obligation in Hord. tauto.
  - apply hd_all_of. intros u i w E Hi. exact (Hdup u i w E Hi).
Qed.

(** (a) Duplicates.  A second copy of event [e] is absorbed (the state is the one without it)
    when [e] is not in [v_not_idem] and no event delivered between the two copies forms an
    obligation pair with [e].  Both conditions are needed: an event in [v_not_idem], delivered
    twice in a row from some state of the domain, ends elsewhere than delivered once; and for an
    obligation pair [e], [f] there is a state of the domain from which [e, f, e] (a duplicate of [e]
    on either side of [f]) ends elsewhere than one of the two log orders [e, f] and [f, e].  So
    a runtime may apply a redelivered event again exactly under the first condition; [Replica]
    drops every redelivery by log position, which [check_tables_replica] covers. *)
Theorem check_tables_duplicate valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  let nf := v_nf v in
  exists dom : nat -> Prop,
    domain_spec valid apply pairs reach init nf dom
    /\ (forall e p m w s, dom s -> Forall (fun x => x < nevents apply) (p ++ e :: m ++ w) ->
          ~ In e (v_not_idem v) -> (forall f, In f m -> ~ obligation v e f) ->
          run apply nf (p ++ e :: m ++ e :: w) s = run apply nf (p ++ e :: m ++ w) s)
    /\ (forall e, In e (v_not_idem v) -> exists s, dom s /\ run apply nf [e; e] s <> run apply nf [e] s)
    /\ (forall e f, obligation v e f -> exists s, dom s /\
          (run apply nf [e; f; e] s <> run apply nf [e; f] s \/ run apply nf [e; f; e] s <> run apply nf [f; e] s)).
Proof.
  intros v Hc nf. destruct (delivery_hyps valid repair apply pairs reach init Hc)
    as (dom & Hspec & Hcomm & Hid & Hobl & Hnid).
  exists dom. split; [exact Hspec|]. destruct Hspec as (_ & _ & _ & Hcl & _). split; [|split].
  - intros e p m w s Hs Hall Hn Hm.
    set (ok := fun x => x < nevents apply).
    assert (Hp : Forall ok p) by (apply Forall_app in Hall; apply Hall).
    assert (Hrest : Forall ok (e :: m ++ w)) by (apply Forall_app in Hall; apply Hall).
    inversion Hrest as [|? ? He Hmw]; subst.
    apply Forall_app in Hmw as [Hmf Hwf].
    rewrite !run_fold.
    change (fold_left (fun s e => nstep apply nf e s)) with (runs (nstep apply nf)).
    rewrite !runs_app.
    replace (e :: m ++ e :: w) with ((e :: m ++ [e]) ++ w) by (simpl; rewrite <- app_assoc; reflexivity).
    replace (e :: m ++ w) with ((e :: m) ++ w) by reflexivity.
    rewrite !runs_app. f_equal.
    apply (absorb (nstep apply nf) dom ok (fun a b => In (a, b) (v_obligations v)) (fun x => ~ In x (v_not_idem v)));
      auto.
    + apply runs_dom with (ok := ok); auto.
    + rewrite Forall_forall in Hmf |- *. intros f Hf. split; [apply Hmf; auto|].
      specialize (Hm f Hf). unfold obligation in Hm. tauto.
  - intros e H. destruct (Hnid e H) as [s [Hs Hne]]. exists s. split; auto.
  - intros e f [H|H].
    + destruct (Hobl e f H) as [s [Hs Hne]]. exists s. split; [exact Hs|]. cbn [run].
      destruct (Nat.eq_dec (nstep apply nf e (nstep apply nf f (nstep apply nf e s))) (nstep apply nf e (nstep apply nf f s)))
        as [E|E]; [left; rewrite E; intros E'; apply Hne; symmetry; exact E'|right; exact E].
    + destruct (Hobl f e H) as [s [Hs Hne]]. exists s. split; [exact Hs|]. cbn [run].
      destruct (Nat.eq_dec (nstep apply nf e (nstep apply nf f (nstep apply nf e s))) (nstep apply nf e (nstep apply nf f s)))
        as [E|E]; [left; rewrite E; intros E'; apply Hne; exact E'|right; exact E].
Qed.
