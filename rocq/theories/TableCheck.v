(** * The table checker.

    Input: the validity flags and the ONE-STEP repair table of a machine with [n] states,
    its raw event tables [apply e s] (before normalization), the checked pairs, the domain
    mode and the initial state.  The checker establishes termination of repair itself
    (by pointer doubling with a bounded number of rounds), computes the normal-form table,
    the normalized steps, the checked domain, CC1 on the domain for the checked pairs and
    CC2 on every state.  [check_tables_sound] says what a [true] verdict means. *)

From Coq Require Import List Arith Bool Lia Relations.
From Govern Require Import Vec.
Import ListNotations.

(** ** Tail-recursive list helpers (the extracted code runs them as loops) *)

Fixpoint tlen_aux {A} (l : list A) (acc : nat) : nat :=
  match l with [] => acc | _ :: t => tlen_aux t (S acc) end.
Definition tlen {A} (l : list A) : nat := tlen_aux l 0.

Fixpoint rmap {A B} (f : A -> B) (l : list A) (acc : list B) : list B :=
  match l with [] => acc | x :: t => rmap f t (f x :: acc) end.
Definition tmap {A B} (f : A -> B) (l : list A) : list B := rmap (fun x => x) (rmap f l []) [].

Fixpoint tall {A} (p : A -> bool) (l : list A) : bool :=
  match l with [] => true | x :: t => if p x then tall p t else false end.

Fixpoint tall2 {A B} (p : A -> B -> bool) (l1 : list A) (l2 : list B) : bool :=
  match l1 with
  | [] => true
  | x :: t => match l2 with [] => true | y :: u => if p x y then tall2 p t u else false end
  end.

Fixpoint desc_aux (i fuel : nat) (acc : list nat) : list nat :=
  match fuel with O => acc | S f => desc_aux (S i) f (i :: acc) end.
(** [n-1; ...; 1; 0] *)
Definition desc (n : nat) : list nat := desc_aux 0 n [].

Fixpoint prow (a : nat) (bs : list nat) (acc : list (nat * nat)) : list (nat * nat) :=
  match bs with [] => acc | b :: t => prow a t (if Nat.ltb a b then (a, b) :: acc else acc) end.
Fixpoint pall (as_ bs : list nat) (acc : list (nat * nat)) : list (nat * nat) :=
  match as_ with [] => acc | a :: t => pall t bs (prow a bs acc) end.
(** Every unordered pair [(a, b)], [a < b < e], in lexicographic order. *)
Definition all_pairs (e : nat) : list (nat * nat) := let l := desc e in pall l l [].

(** ** The checker *)

Definition row_ok (n : nat) (a : vec) : bool := Nat.eqb (vlen a) n && Nat.ltb (vmax a) n.

Definition pair_ok (ne : nat) (p : nat * nat) : bool :=
  Nat.ltb (fst p) ne && Nat.ltb (snd p) ne && negb (Nat.eqb (fst p) (snd p)).

(** Shapes and ranges; and repair leaves every valid state where it is. *)
Definition well_formed (valid : mask) (repair : vec) (apply : list vec)
    (pairs : option (list (nat * nat))) (init : nat) : bool :=
  let n := mlen valid in
  Nat.ltb init n && row_ok n repair && mall (veq (vgather repair (mwhere valid)) (mwhere valid))
  && tall (row_ok n) apply
  && match pairs with None => true | Some ps => tall (pair_ok (tlen apply)) ps end.

(** Pointer doubling: [F] is repair iterated [m] times, [D] counts the invalid states met on
    the way; each round doubles [m].  Stops as soon as every [F s] is valid. *)
Fixpoint nf_loop (fuel : nat) (valid : mask) (F D : vec) : bool * vec * vec :=
  if mallat valid F then (true, F, D) else
  match fuel with
  | O => (false, F, D)
  | S k => let FD := vjump F D in nf_loop k valid (fst FD) (snd FD)
  end.

Definition nf_result (valid : mask) (repair : vec) : bool * vec * vec :=
  nf_loop (S (Nat.log2 (mlen valid))) valid repair (vnotbit valid).

(** Adds every one-step successor of the marked states. *)
Fixpoint grow (steps : list vec) (idx : vec) (n : nat) (m : mask) : mask :=
  match steps with [] => m | st :: t => grow t idx n (mor m (mmark n (vgather st idx))) end.

Fixpoint reach_loop (fuel : nat) (steps : list vec) (n : nat) (m : mask) : mask :=
  match fuel with
  | O => m
  | S k => let m' := grow steps (mwhere m) n m in
           if Nat.eqb (mcount m') (mcount m) then m else reach_loop k steps n m'
  end.

(** The checked domain, in positions of the valid states (see [check_tables]): every valid
    state, or the states reachable from [pinit] by the position step tables. *)
Definition domain_mask (m : nat) (psteps : list vec) (reach : bool) (pinit : nat) : mask :=
  if reach then reach_loop m psteps m (vequals (viota m) pinit) else veq (viota m) (viota m).

(** The domain mask has the right length, holds the initial position and is closed under
    every position step. *)
Definition dom_ok (m : nat) (psteps : list vec) (dm : mask) (pinit : nat) : bool :=
  let didx := mwhere dm in
  Nat.eqb (mlen dm) m && mnth dm pinit
  && tall (fun st => mall (mgather dm (vgather st didx))) psteps.

Definition dflt : vec := viota 0.

(** The first failing pair and a domain state where it fails, if any ([ids] names the
    domain's states). *)
Fixpoint cc1_loop (steps stepsD : list vec) (ids : vec) (ps : list (nat * nat)) : option (nat * nat * nat) :=
  match ps with
  | [] => None
  | p :: t =>
      let a := fst p in let b := snd p in
      let x := nth b steps dflt in let u := nth a stepsD dflt in
      let y := nth a steps dflt in let w := nth b stepsD dflt in
      if vgeq x u y w then cc1_loop steps stepsD ids t
      else Some (a, b, vnth ids (mfirst_false (veq (vgather x u) (vgather y w))))
  end.

(** The delivery rules, over positions of the domain ([stepsD] holds every step table read at the
    domain's positions [didx]): the pairs of [ps] that do not commute somewhere on the domain, and
    the events [es] whose second application changes some domain state. *)
Fixpoint obl_loop (steps stepsD : list vec) (ps : list (nat * nat)) (acc : list (nat * nat)) : list (nat * nat) :=
  match ps with
  | [] => acc
  | p :: t =>
      let a := fst p in let b := snd p in
      obl_loop steps stepsD t
        (if vgeq (nth b steps dflt) (nth a stepsD dflt) (nth a steps dflt) (nth b stepsD dflt) then acc
         else p :: acc)
  end.

Fixpoint idem_loop (steps stepsD : list vec) (didx : vec) (es : list nat) (acc : list nat) : list nat :=
  match es with
  | [] => acc
  | e :: t =>
      let st := nth e steps dflt in
      idem_loop steps stepsD didx t (if vgeq st (nth e stepsD dflt) st didx then acc else e :: acc)
  end.

(** CC2 for every event: [F (apply e s)] equals the normalized step of [F s], read from the
    event's step table on the valid states [xv] at the position [PF s] of [F s]. *)
Definition cc2_ok (F PF : vec) (apply XV : list vec) : bool :=
  tall2 (fun a xv => vgeq F a xv PF) apply XV.

(** [P] numbers the valid states: it inverts [V = mwhere valid] on [V]'s positions. *)
Definition pos_ok (P V : vec) : bool := mall (veq (vgather P V) (viota (vlen V))).

Record verdict := Verdict {
  v_wellformed : bool;  (** inputs have the right shapes and ranges *)
  v_certified : bool;   (** WFC, initial state valid, domain checked, CC1 on the domain *)
  v_wfc : bool;
  v_max_depth : nat;
  v_initial_valid : bool;
  v_domain_ok : bool;
  v_cc1 : bool;
  v_witness : option (nat * nat * nat);
  v_cc2 : bool;
  v_nf : vec;
  v_domain_size : nat;
  v_obligations : list (nat * nat);  (** when certified: the pairs a < b that do not commute on the domain *)
  v_not_idem : list nat }.           (** when certified: the events whose second application changes a domain state *)

(** The rest of the checker, given whether repair terminates ([wfc]), the normal forms [F] and
    the repair depths [D]: shared by [check_tables] and [check_tables_w].  After termination is
    established, it works in positions of the valid states:
    [V] lists them, [P] maps a valid state to its position (checked by [pos_ok]), [XV] holds
    every event's normalized step from each valid state, [PV] the same as positions.  CC2 is
    checked on every state, the domain and CC1 on positions (small tables when few states
    are valid). *)
Definition check_from_nf (valid : mask) (apply : list vec) (pairs : option (list (nat * nat)))
    (reach : bool) (init : nat) (wfc : bool) (F D : vec) : verdict :=
  let depth := vmax D in
  if negb wfc then Verdict true false false depth false false false None false F 0 [] [] else
  let V := mwhere valid in
  let P := vrank valid in
  if negb (pos_ok P V) then Verdict false false false depth false false false None false F 0 [] [] else
  let XV := tmap (fun a => vgather F (vgather a V)) apply in
  let cc2 := cc2_ok F (vgather P F) apply XV in
  if negb (mnth valid init) then Verdict true false true depth false false false None cc2 F 0 [] [] else
  let m := vlen V in
  let PV := tmap (fun xv => vgather P xv) XV in
  let pinit := vnth P init in
  let dm := domain_mask m PV reach pinit in
  if negb (dom_ok m PV dm pinit) then Verdict true false true depth true false false None cc2 F 0 [] [] else
  let didx := mwhere dm in
  let ps := match pairs with None => all_pairs (tlen apply) | Some ps => ps end in
  let PVD := tmap (fun st => vgather st didx) PV in
  let w := cc1_loop PV PVD (vgather V didx) ps in
  let cc1 := match w with None => true | Some _ => false end in
  let obl := if cc1 then match pairs with None => [] | Some _ => obl_loop PV PVD (all_pairs (tlen apply)) [] end
             else [] in
  let nid := if cc1 then idem_loop PV PVD didx (desc (tlen apply)) [] else [] in
  Verdict true cc1 true depth true true cc1 w cc2 F (vlen didx) obl nid.

(** [check_tables] runs [check_from_nf] on the normal forms and depths it computes itself by pointer
    doubling ([nf_result]); [check_tables_w] below runs it on a checked witness. *)
Definition check_tables (valid : mask) (repair : vec) (apply : list vec)
    (pairs : option (list (nat * nat))) (reach : bool) (init : nat) : verdict :=
  if negb (well_formed valid repair apply pairs init)
  then Verdict false false false 0 false false false None false repair 0 [] [] else
  match nf_result valid repair with
  | (wfc, F, D) => check_from_nf valid apply pairs reach init wfc F D
  end.

(** ** Facts about the helpers *)

Lemma tlen_aux_length {A} (l : list A) acc : tlen_aux l acc = length l + acc.
Proof. revert acc; induction l; intros acc; simpl; [auto|rewrite IHl; lia]. Qed.
Lemma tlen_length {A} (l : list A) : tlen l = length l.
Proof. unfold tlen. rewrite tlen_aux_length. lia. Qed.

Lemma rmap_spec {A B} (f : A -> B) l acc : rmap f l acc = rev (map f l) ++ acc.
Proof.
  revert acc; induction l as [|x l IH]; intros acc; simpl; auto.
  rewrite IH, <- app_assoc. reflexivity.
Qed.
Lemma tmap_map {A B} (f : A -> B) l : tmap f l = map f l.
Proof. unfold tmap. rewrite !rmap_spec, !app_nil_r, map_id, rev_involutive. reflexivity. Qed.

Lemma tall_forall {A} (p : A -> bool) l : tall p l = true <-> forall x, In x l -> p x = true.
Proof.
  induction l as [|x l IH]; simpl; [tauto|].
  destruct (p x) eqn:E; rewrite ?IH; split; intros H.
  - intros y [<-|Hy]; auto.
  - intros y Hy; auto.
  - discriminate.
  - specialize (H x (or_introl eq_refl)). congruence.
Qed.

Lemma tall2_nth {A B} (p : A -> B -> bool) l1 l2 da db : length l1 = length l2 ->
  (tall2 p l1 l2 = true <-> forall i, i < length l1 -> p (nth i l1 da) (nth i l2 db) = true).
Proof.
  revert l2; induction l1 as [|x t IH]; intros [|y u] Hl; simpl in *; try discriminate.
  - split; [intros _ i Hi; lia|auto].
  - injection Hl as Hl. destruct (p x y) eqn:E; [rewrite (IH u Hl)|]; split.
    + intros H [|i] Hi; auto. apply H. lia.
    + intros H i Hi. apply (H (S i)). lia.
    + discriminate.
    + intros H. specialize (H 0 ltac:(lia)). simpl in H. congruence.
Qed.

Lemma in_desc_aux i f acc x : In x (desc_aux i f acc) <-> (i <= x < i + f) \/ In x acc.
Proof.
  revert i acc; induction f as [|f IH]; intros i acc; simpl.
  - split; [auto|intros [H|H]; [lia|auto]].
  - rewrite IH. simpl. split.
    + intros [H|[H|H]]; [left; lia|left; lia|right; auto].
    + intros [H|H]; [destruct (Nat.eq_dec i x); [right; left; auto|left; lia]|right; right; auto].
Qed.
Lemma in_desc n x : In x (desc n) <-> x < n.
Proof. unfold desc. rewrite in_desc_aux. simpl. split; [intros [H|[]]; lia|intros H; left; lia]. Qed.

Lemma in_prow a bs acc p : In p (prow a bs acc) <-> (exists b, In b bs /\ a < b /\ p = (a, b)) \/ In p acc.
Proof.
  revert acc; induction bs as [|b bs IH]; intros acc; simpl.
  - split; [auto|intros [[b [[] _]]|H]; auto].
  - rewrite IH. destruct (Nat.ltb a b) eqn:E; [apply Nat.ltb_lt in E|apply Nat.ltb_ge in E]; simpl; split.
    + intros [[c [Hc [Hl ->]]]|[<-|H]]; [left; exists c; auto|left; exists b; auto|auto].
    + intros [[c [[<-|Hc] [Hl ->]]]|H]; auto. left; exists c; auto.
    + intros [[c [Hc [Hl ->]]]|H]; auto. left; exists c; auto.
    + intros [[c [[<-|Hc] [Hl ->]]]|H]; [lia| |auto]. left; exists c; auto.
Qed.

Lemma in_pall as_ bs acc p :
  In p (pall as_ bs acc) <-> (exists a b, In a as_ /\ In b bs /\ a < b /\ p = (a, b)) \/ In p acc.
Proof.
  revert acc; induction as_ as [|a as_ IH]; intros acc; simpl.
  - split; [auto|intros [[a [b [[] _]]]|H]; auto].
  - rewrite IH, in_prow. split.
    + intros [[x [y (H1 & H2 & H3 & H4)]]|[[y (H1 & H2 & H3)]|H]]; [left; exists x, y; auto|left; exists a, y; auto|auto].
    + intros [[x [y ([<-|H1] & H2 & H3 & H4)]]|H]; [right; left; exists y; auto|left; exists x, y; auto|auto].
Qed.

Lemma in_all_pairs e a b : In (a, b) (all_pairs e) <-> a < b /\ b < e.
Proof.
  unfold all_pairs. rewrite in_pall. split.
  - intros [[x [y (H1 & H2 & H3 & H4)]]|[]]. injection H4 as -> ->. rewrite in_desc in *. lia.
  - intros [H1 H2]. left. exists a, b. rewrite !in_desc. repeat split; auto; lia.
Qed.

(** ** The meaning of the tables *)

Section Meaning.
Variables (valid : mask) (repair : vec) (apply : list vec).

Definition nstates : nat := mlen valid.
Definition nevents : nat := length apply.
Definition is_valid (s : nat) : Prop := mnth valid s = true.
(** One repair step, as the table says. *)
Definition rep (s : nat) : nat := vnth repair s.
(** The raw effect of event [e] on state [s] (before normalization). *)
Definition app (e s : nat) : nat := vnth (nth e apply dflt) s.

Fixpoint iter (k s : nat) : nat := match k with O => s | S j => iter j (rep s) end.

(** The number of invalid states among [s, rep s, ..., rep^(k-1) s]. *)
Fixpoint cnt (k s : nat) : nat :=
  match k with O => 0 | S j => (if mnth valid s then 0 else 1) + cnt j (rep s) end.

Lemma iter_add a b s : iter (a + b) s = iter b (iter a s).
Proof. revert s; induction a; intros s; simpl; auto. Qed.

Lemma cnt_add a b s : cnt (a + b) s = cnt a s + cnt b (iter a s).
Proof. revert s; induction a; intros s; simpl; auto. rewrite IHa. lia. Qed.

Lemma iter_S k s : iter (S k) s = rep (iter k s).
Proof. replace (S k) with (k + 1) by lia. rewrite iter_add. reflexivity. Qed.

End Meaning.

(** ** Well-formedness facts *)

Section WF.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).
Hypothesis WF : well_formed valid repair apply pairs init = true.
Let n := mlen valid.

Lemma wf_parts :
  init < n /\ vlen repair = n /\ vmax repair < n
  /\ (forall s, s < n -> mnth valid s = true -> vnth repair s = s)
  /\ (forall e, e < nevents apply -> vlen (nth e apply dflt) = n /\ vmax (nth e apply dflt) < n)
  /\ (forall ps, pairs = Some ps -> forall a b, In (a, b) ps -> a < nevents apply /\ b < nevents apply /\ a <> b).
Proof.
  unfold well_formed in WF. fold n in WF.
  apply andb_prop in WF as [WF Hp]. apply andb_prop in WF as [WF Hap].
  apply andb_prop in WF as [WF Hfix]. apply andb_prop in WF as [Hi Hr].
  apply Nat.ltb_lt in Hi. unfold row_ok in Hr. apply andb_prop in Hr as [Hr1 Hr2].
  apply Nat.eqb_eq in Hr1. apply Nat.ltb_lt in Hr2.
  rewrite tall_forall in Hap.
  split; [exact Hi|]. split; [exact Hr1|]. split; [exact Hr2|]. split; [|split].
  - intros s Hs Hv. destruct (mwhere_cover valid s Hs Hv) as [j [Hj Ej]].
    rewrite mall_spec in Hfix.
    assert (Hj' : j < mlen (veq (vgather repair (mwhere valid)) (mwhere valid)))
      by (rewrite mlen_veq; rewrite ?vlen_vgather; auto).
    specialize (Hfix j Hj'). rewrite mnth_veq in Hfix by (rewrite ?vlen_vgather; auto).
    rewrite vnth_vgather, Ej in Hfix by auto. apply Nat.eqb_eq in Hfix. auto.
  - intros e He. assert (Hin : In (nth e apply dflt) apply) by (apply nth_In; auto).
    specialize (Hap _ Hin). unfold row_ok in Hap. apply andb_prop in Hap as [H1 H2].
    apply Nat.eqb_eq in H1. apply Nat.ltb_lt in H2. auto.
  - intros ps -> a b Hab. rewrite tall_forall in Hp. specialize (Hp _ Hab).
    unfold pair_ok in Hp. simpl in Hp. rewrite tlen_length in Hp.
    apply andb_prop in Hp as [Hp H3]. apply andb_prop in Hp as [H1 H2].
    apply Nat.ltb_lt in H1. apply Nat.ltb_lt in H2. apply negb_true_iff, Nat.eqb_neq in H3. auto.
Qed.

Lemma rep_lt s : s < n -> rep repair s < n.
Proof.
  destruct wf_parts as (_ & Hl & Hm & _). intros Hs. unfold rep. apply vmax_lt with (a := repair); auto. lia.
Qed.

Lemma iter_lt k s : s < n -> iter repair k s < n.
Proof. revert s; induction k; intros s Hs; simpl; auto. apply IHk, rep_lt; auto. Qed.

Lemma rep_valid s : s < n -> mnth valid s = true -> rep repair s = s.
Proof. destruct wf_parts as (_ & _ & _ & H & _). apply H. Qed.

Lemma iter_valid k s : s < n -> mnth valid s = true -> iter repair k s = s.
Proof. induction k; intros Hs Hv; simpl; auto. rewrite rep_valid; auto. Qed.

Lemma cnt_valid k s : s < n -> mnth valid s = true -> cnt valid repair k s = 0.
Proof. induction k; intros Hs Hv; simpl; auto. rewrite Hv, rep_valid; auto. Qed.

Lemma app_lt e s : e < nevents apply -> s < n -> app apply e s < n.
Proof.
  destruct wf_parts as (_ & _ & _ & _ & H & _). intros He Hs. unfold app.
  destruct (H e He) as [H1 H2]. apply vmax_lt with (a := nth e apply dflt); auto. lia.
Qed.

(** The invariant of the doubling loop. *)
Definition inv (m : nat) (F D : vec) : Prop :=
  vlen F = n /\ vlen D = n /\
  forall s, s < n -> vnth F s = iter repair m s /\ vnth D s = cnt valid repair m s.

Lemma inv_init : inv 1 repair (vnotbit valid).
Proof.
  destruct wf_parts as (_ & Hl & _). unfold inv. rewrite vlen_vnotbit. split; [auto|split; [auto|]].
  intros s Hs. simpl. split; auto. rewrite vnth_vnotbit by auto. destruct (mnth valid s); auto.
Qed.

Lemma inv_double m F D : inv m F D -> inv (m + m) (vgather F F) (vadd D (vgather D F)).
Proof.
  intros (HF & HD & H). unfold inv.
  assert (Hg : vlen (vgather D F) = n) by (rewrite vlen_vgather; auto).
  split; [|split].
  - rewrite vlen_vgather; auto.
  - rewrite vlen_vadd; auto. rewrite Hg; auto.
  - intros s Hs. split.
   + rewrite vnth_vgather by lia. destruct (H s Hs) as [E1 _]. rewrite E1.
    destruct (H (iter repair m s)) as [E2 _]; [apply iter_lt; auto|]. rewrite E2, iter_add. reflexivity.
   + rewrite vnth_vadd by (rewrite ?Hg; lia). rewrite vnth_vgather by lia.
    destruct (H s Hs) as [E1 E3]. rewrite E1, E3.
    destruct (H (iter repair m s)) as [_ E4]; [apply iter_lt; auto|]. rewrite E4, cnt_add. reflexivity.
Qed.

Lemma all_valid_F F : vlen F = n -> mall (mgather valid F) = true -> forall s, s < n -> mnth valid (vnth F s) = true.
Proof.
  intros HF Ha s Hs. rewrite mall_spec in Ha. rewrite mlen_mgather in Ha.
  specialize (Ha s ltac:(lia)). rewrite mnth_mgather in Ha by lia. auto.
Qed.

Lemma nf_loop_spec fuel m F D b F' D' :
  inv m F D -> nf_loop fuel valid F D = (b, F', D') ->
  exists m', inv m' F' D' /\ (b = true -> forall s, s < n -> mnth valid (vnth F' s) = true).
Proof.
  revert m F D. induction fuel as [|k IH]; intros m F D Hinv Hl; simpl in Hl.
  - destruct (mallat valid F) eqn:Ha; unfold mallat in Ha; injection Hl as <- <- <-; exists m; split; auto.
    + intros _. apply all_valid_F; auto. apply Hinv.
    + discriminate.
  - destruct (mallat valid F) eqn:Ha; unfold mallat in Ha.
    + injection Hl as <- <- <-. exists m. split; auto. intros _. apply all_valid_F; auto. apply Hinv.
    + apply (IH (m + m)) in Hl; auto. apply inv_double; auto.
Qed.

End WF.

(** ** Soundness *)

(** The normalized step, read from the normal-form table [nf]. *)
Definition nstep (apply : list vec) (nf : vec) (e s : nat) : nat := vnth nf (app apply e s).

Fixpoint run (apply : list vec) (nf : vec) (es : list nat) (s : nat) : nat :=
  match es with [] => s | e :: t => run apply nf t (nstep apply nf e s) end.

(** Well-founded compensation on the states [0 .. n-1]: a potential that every repair step
    of an invalid state decreases; and [nf] is the normal form: a valid state reached by
    iterating repair, the only one. *)
Definition WFC (valid : mask) (repair : vec) : Prop :=
  exists phi : nat -> nat, forall s, s < mlen valid -> mnth valid s = false -> phi (rep repair s) < phi s.

Definition IsNF (valid : mask) (repair : vec) (nf : vec) : Prop :=
  vlen nf = mlen valid /\
  forall s, s < mlen valid ->
    vnth nf s < mlen valid /\ mnth valid (vnth nf s) = true
    /\ (exists k, vnth nf s = iter repair k s)
    /\ (forall k, mnth valid (iter repair k s) = true -> iter repair k s = vnth nf s).

Definition CC2 (valid : mask) (apply : list vec) (nf : vec) : Prop :=
  forall e s, e < nevents apply -> s < mlen valid ->
    vnth nf (app apply e s) = vnth nf (app apply e (vnth nf s)).

Definition checked (pairs : option (list (nat * nat))) (ne a b : nat) : Prop :=
  match pairs with None => a < b /\ b < ne | Some ps => In (a, b) ps end.

Section Sound.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat)))
  (reach : bool) (init : nat).
Let n := mlen valid.
Let v := check_tables valid repair apply pairs reach init.

Lemma wellformed_true : v_wellformed v = true -> well_formed valid repair apply pairs init = true.
Proof.
  subst v. unfold check_tables, check_from_nf. destruct (well_formed valid repair apply pairs init); auto.
Qed.

Lemma nf_facts (WF : well_formed valid repair apply pairs init = true) b F D :
  nf_result valid repair = (b, F, D) -> b = true ->
  WFC valid repair /\ IsNF valid repair F.
Proof.
  intros HN Hb. unfold nf_result in HN.
  destruct (nf_loop_spec valid repair apply pairs init WF _ _ _ _ _ _ _ (inv_init valid repair apply pairs init WF) HN)
    as [m [(HF & HD & Hinv) Hall]].
  specialize (Hall Hb). fold n in HF, HD, Hinv, Hall.
  pose proof (iter_valid valid repair apply pairs init WF) as IV.
  pose proof (iter_lt valid repair apply pairs init WF) as IL.
  assert (Hstay : forall k s, s < n -> mnth valid (iter repair k s) = true -> iter repair k s = iter repair m s).
  { intros k s Hs Hk. specialize (Hall s Hs). destruct (Hinv s Hs) as [E _]. rewrite E in Hall.
    destruct (Nat.le_ge_cases k m) as [Hle|Hle].
    - replace m with (k + (m - k)) by lia. rewrite iter_add. symmetry. apply IV; auto.
    - replace k with (m + (k - m)) by lia. rewrite iter_add. apply IV; auto. }
  split.
  - exists (cnt valid repair m). intros s Hs Hv.
    destruct m as [|m].
    + specialize (Hall s Hs). destruct (Hinv s Hs) as [E _]. rewrite E in Hall. simpl in Hall. congruence.
    + assert (Hv' : mnth valid (iter repair (S m) s) = true).
      { specialize (Hall s Hs). destruct (Hinv s Hs) as [E _]. rewrite E in Hall. auto. }
      assert (A : cnt valid repair (S m) s = 1 + cnt valid repair m (rep repair s)).
      { simpl. rewrite Hv. reflexivity. }
      assert (B : cnt valid repair (S m) (rep repair s) = cnt valid repair m (rep repair s)).
      { replace (S m) with (m + 1) by lia. rewrite cnt_add.
        change (iter repair m (rep repair s)) with (iter repair (S m) s).
        cbn [cnt]. rewrite Hv'. lia. }
      lia.
  - split; auto. intros s Hs. destruct (Hinv s Hs) as [E _]. rewrite E. repeat split.
    + apply IL; auto.
    + specialize (Hall s Hs). rewrite E in Hall. auto.
    + exists m; auto.
    + intros k Hk. apply Hstay; auto.
Qed.


Section Facts.
Hypothesis WF : well_formed valid repair apply pairs init = true.
Variable F : vec.
Hypothesis HF : IsNF valid repair F.
Variable P : vec.
Hypothesis HP : pos_ok P (mwhere valid) = true.

Lemma wfp : init < n /\ vlen repair = n /\ vmax repair < n
  /\ (forall s, s < n -> mnth valid s = true -> vnth repair s = s)
  /\ (forall e, e < nevents apply -> vlen (nth e apply dflt) = n /\ vmax (nth e apply dflt) < n)
  /\ (forall ps, pairs = Some ps -> forall a b, In (a, b) ps -> a < nevents apply /\ b < nevents apply /\ a <> b).
Proof using WF HF HP. exact (wf_parts valid repair apply pairs init WF). Qed.

Lemma row_len e : e < nevents apply -> vlen (nth e apply dflt) = n.
Proof using WF HF HP. intros He. destruct wfp as (_ & _ & _ & _ & H & _). apply H; auto. Qed.

Lemma app_in e s : e < nevents apply -> s < n -> app apply e s < n.
Proof using WF HF HP. apply (app_lt valid repair apply pairs init WF). Qed.

Lemma nf_len : vlen F = n.
Proof using WF HF HP. apply HF. Qed.

Lemma nf_lt s : s < n -> vnth F s < n.
Proof using WF HF HP. intros Hs. apply HF; auto. Qed.

Lemma nf_valid s : s < n -> mnth valid (vnth F s) = true.
Proof using WF HF HP. intros Hs. apply HF; auto. Qed.

Lemma step_lt e s : e < nevents apply -> s < n -> nstep apply F e s < n.
Proof using WF HF HP. intros He Hs. unfold nstep. apply nf_lt, app_in; auto. Qed.

Lemma step_valid e s : e < nevents apply -> s < n -> mnth valid (nstep apply F e s) = true.
Proof using WF HF HP. intros He Hs. unfold nstep. apply nf_valid, app_in; auto. Qed.

(** Positions of the valid states. *)
Lemma V_facts j : j < vlen (mwhere valid) -> vnth (mwhere valid) j < n /\ mnth valid (vnth (mwhere valid) j) = true.
Proof using WF HF HP. intros Hj. apply vnth_mwhere. exact Hj. Qed.

Lemma P_V j : j < vlen (mwhere valid) -> vnth P (vnth (mwhere valid) j) = j.
Proof using WF HF HP.
  intros Hj. pose proof HP as H. unfold pos_ok in H. rewrite mall_spec in H.
  assert (Hl : mlen (veq (vgather P (mwhere valid)) (viota (vlen (mwhere valid)))) = vlen (mwhere valid)).
  { rewrite mlen_veq; rewrite ?vlen_vgather, ?vlen_viota; reflexivity. }
  rewrite Hl in H. specialize (H j Hj).
  rewrite mnth_veq in H by (rewrite ?vlen_vgather, ?vlen_viota; auto).
  apply Nat.eqb_eq in H. rewrite vnth_vgather, vnth_viota in H by auto. exact H.
Qed.

Lemma P_lt s : s < n -> mnth valid s = true -> vnth P s < vlen (mwhere valid) /\ vnth (mwhere valid) (vnth P s) = s.
Proof using WF HF HP.
  intros Hs Hv. destruct (mwhere_cover valid s Hs Hv) as [j [Hj E]].
  rewrite <- E, P_V by exact Hj. auto.
Qed.

Lemma V_inj i j : i < vlen (mwhere valid) -> j < vlen (mwhere valid) ->
  vnth (mwhere valid) i = vnth (mwhere valid) j -> i = j.
Proof using WF HF HP. intros Hi Hj E. rewrite <- (P_V i Hi), <- (P_V j Hj), E. reflexivity. Qed.

Let XV := tmap (fun a => vgather F (vgather a (mwhere valid))) apply.
Let PV := tmap (fun xv => vgather P xv) XV.

Lemma XV_len : length XV = nevents apply.
Proof using WF HF HP. unfold XV. rewrite tmap_map, map_length. reflexivity. Qed.

Lemma PV_len : length PV = nevents apply.
Proof using WF HF HP. unfold PV. rewrite tmap_map, map_length, XV_len. reflexivity. Qed.

Lemma XV_nth e : e < nevents apply -> nth e XV dflt = vgather F (vgather (nth e apply dflt) (mwhere valid)).
Proof using WF HF HP. intros He. unfold XV. rewrite tmap_map. rewrite (nth_map_lt _ _ _ _ dflt) by auto. reflexivity. Qed.

Lemma XV_vlen e : e < nevents apply -> vlen (nth e XV dflt) = vlen (mwhere valid).
Proof using WF HF HP. intros He. rewrite XV_nth by auto. rewrite !vlen_vgather. reflexivity. Qed.

Lemma XV_val e j : e < nevents apply -> j < vlen (mwhere valid) ->
  vnth (nth e XV dflt) j = nstep apply F e (vnth (mwhere valid) j).
Proof using WF HF HP.
  intros He Hj. rewrite XV_nth by auto.
  rewrite vnth_vgather by (rewrite vlen_vgather; auto).
  rewrite vnth_vgather by auto. reflexivity.
Qed.

Lemma PV_nth e : e < nevents apply -> nth e PV dflt = vgather P (nth e XV dflt).
Proof using WF HF HP.
  intros He. unfold PV. rewrite tmap_map. rewrite (nth_map_lt _ _ _ _ dflt) by (rewrite XV_len; auto). reflexivity.
Qed.

Lemma PV_val e j : e < nevents apply -> j < vlen (mwhere valid) ->
  vnth (nth e PV dflt) j < vlen (mwhere valid)
  /\ vnth (mwhere valid) (vnth (nth e PV dflt) j) = nstep apply F e (vnth (mwhere valid) j).
Proof using WF HF HP.
  intros He Hj. rewrite PV_nth by auto. rewrite vnth_vgather by (rewrite XV_vlen; auto).
  rewrite XV_val by auto. destruct (V_facts j Hj) as [H1 _].
  apply P_lt; [apply step_lt|apply step_valid]; auto.
Qed.

(** Two normalized steps from a valid state, read in positions. *)
Lemma PV_two a b j : a < nevents apply -> b < nevents apply -> j < vlen (mwhere valid) ->
  vnth (nth b PV dflt) (vnth (nth a PV dflt) j) < vlen (mwhere valid)
  /\ nstep apply F b (nstep apply F a (vnth (mwhere valid) j))
     = vnth (mwhere valid) (vnth (nth b PV dflt) (vnth (nth a PV dflt) j)).
Proof using WF HF HP.
  intros Ha Hb Hj. destruct (PV_val a j Ha Hj) as [H1 E1].
  destruct (PV_val b _ Hb H1) as [H2 E2]. split; [exact H2|]. rewrite <- E1, E2. reflexivity.
Qed.

Lemma cc2_ok_spec : cc2_ok F (vgather P F) apply XV = true <-> CC2 valid apply F.
Proof using WF HF HP.
  unfold cc2_ok. rewrite (tall2_nth _ _ _ dflt dflt) by (rewrite XV_len; reflexivity).
  unfold CC2. split.
  - intros H e s He Hs. specialize (H e He).
    rewrite vgeq_spec in H by (rewrite vlen_vgather, nf_len, row_len; auto).
    rewrite row_len in H by auto. specialize (H s Hs).
    rewrite vnth_vgather in H by (rewrite nf_len; auto).
    destruct (P_lt (vnth F s) (nf_lt s Hs) (nf_valid s Hs)) as [Hp Ep].
    rewrite XV_val in H by auto. rewrite Ep in H. exact H.
  - intros H e He. rewrite vgeq_spec by (rewrite vlen_vgather, nf_len, row_len; auto).
    rewrite row_len by auto. intros s Hs.
    rewrite vnth_vgather by (rewrite nf_len; auto).
    destruct (P_lt (vnth F s) (nf_lt s Hs) (nf_valid s Hs)) as [Hp Ep].
    rewrite XV_val by auto. rewrite Ep. apply H; auto.
Qed.

Lemma in_PV st : In st PV <-> exists e, e < nevents apply /\ st = nth e PV dflt.
Proof using WF HF HP.
  split.
  - intros H. apply In_nth with (d := dflt) in H. destruct H as [e [He E]].
    rewrite PV_len in He. exists e; auto.
  - intros [e [He ->]]. apply nth_In. rewrite PV_len. auto.
Qed.

Lemma dom_ok_spec dm pinit : dom_ok (vlen (mwhere valid)) PV dm pinit = true ->
  mlen dm = vlen (mwhere valid) /\ mnth dm pinit = true
  /\ (forall e j, e < nevents apply -> mnth dm j = true -> mnth dm (vnth (nth e PV dflt) j) = true).
Proof using WF HF HP.
  unfold dom_ok. cbv zeta. intros H. apply andb_prop in H as [H Hcl].
  apply andb_prop in H as [Hl Hi]. apply Nat.eqb_eq in Hl.
  split; [exact Hl|]. split; [exact Hi|].
  intros e j He Hd. destruct (mwhere_cover dm j) as [k [Hk E]]; [apply mnth_lt; auto|auto|].
  rewrite tall_forall in Hcl.
  specialize (Hcl _ (proj2 (in_PV _) (ex_intro _ e (conj He eq_refl)))).
  rewrite mall_spec, mlen_mgather, vlen_vgather in Hcl. specialize (Hcl k Hk).
  rewrite mnth_mgather, vnth_vgather, E in Hcl by (rewrite ?vlen_vgather; auto).
  exact Hcl.
Qed.

Lemma cc1_loop_spec dm ids ps :
  (forall a b, In (a, b) ps -> a < nevents apply /\ b < nevents apply) ->
  cc1_loop PV (tmap (fun st => vgather st (mwhere dm)) PV) ids ps = None ->
  forall a b j, In (a, b) ps -> mnth dm j = true ->
    vnth (nth b PV dflt) (vnth (nth a PV dflt) j) = vnth (nth a PV dflt) (vnth (nth b PV dflt) j).
Proof using WF HF HP.
  intros Hr Hloop a b j Hin Hd.
  set (didx := mwhere dm) in *.
  set (PVD := tmap (fun st => vgather st didx) PV) in *.
  assert (HD : forall e, e < nevents apply -> nth e PVD dflt = vgather (nth e PV dflt) didx).
  { intros e He. unfold PVD. rewrite tmap_map. rewrite (nth_map_lt _ _ _ _ dflt); [reflexivity|].
    rewrite PV_len. auto. }
  assert (Hlen : forall e, e < nevents apply -> vlen (nth e PVD dflt) = vlen didx).
  { intros e He. rewrite HD, vlen_vgather; auto. }
  induction ps as [|p ps IH]; [destruct Hin|].
  simpl in Hloop.
  destruct (vgeq (nth (snd p) PV dflt) (nth (fst p) PVD dflt) (nth (fst p) PV dflt) (nth (snd p) PVD dflt)) eqn:Hok;
    [|discriminate].
  destruct Hin as [->|Hin]; [|apply IH; auto; intros; apply Hr; simpl; auto].
  simpl in Hok. destruct (Hr a b (or_introl eq_refl)) as [Ha Hb].
  destruct (mwhere_cover dm j) as [k [Hk E]]; [apply mnth_lt; auto|auto|].
  fold didx in Hk, E.
  rewrite vgeq_spec in Hok by (rewrite !Hlen; auto).
  rewrite Hlen in Hok by auto.
  specialize (Hok k Hk).
  rewrite !HD in Hok by auto.
  rewrite !vnth_vgather in Hok by auto.
  rewrite E in Hok. exact Hok.
Qed.

End Facts.

End Sound.

(** ** The headline theorems about the checker *)

Theorem check_tables_wfc valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_wfc v = true -> WFC valid repair /\ IsNF valid repair (v_nf v).
Proof.
  cbv zeta. unfold check_tables, check_from_nf.
  destruct (well_formed valid repair apply pairs init) eqn:WF; cbn [negb v_wfc]; [|discriminate].
  destruct (nf_result valid repair) as [[wfc F] D] eqn:HN.
  destruct wfc; cbn [negb v_wfc]; [|discriminate].
  intros _.
  assert (Hnf := nf_facts valid repair apply pairs init WF true F D HN eq_refl).
  repeat match goal with |- context [if ?c then _ else _] => destruct c end; cbn [v_nf]; exact Hnf.
Qed.

Theorem check_tables_cc2 valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_wfc v = true -> (v_cc2 v = true <-> CC2 valid apply (v_nf v)).
Proof.
  cbv zeta. unfold check_tables, check_from_nf.
  destruct (well_formed valid repair apply pairs init) eqn:WF; cbn [negb v_wfc]; [|discriminate].
  destruct (nf_result valid repair) as [[wfc F] D] eqn:HN.
  destruct wfc; cbn [negb v_wfc]; [|discriminate].
  destruct (pos_ok (vrank valid) (mwhere valid)) eqn:HP; cbn [negb v_wfc]; [|discriminate].
  intros _.
  assert (Hnf := nf_facts valid repair apply pairs init WF true F D HN eq_refl).
  assert (H := cc2_ok_spec valid repair apply pairs init WF F (proj2 Hnf) (vrank valid) HP).
  repeat match goal with |- context [if ?c then _ else _] => destruct c end; cbn [v_nf v_cc2]; exact H.
Qed.

Theorem check_tables_sound valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  let n := mlen valid in
  let nf := v_nf v in
  WFC valid repair /\ IsNF valid repair nf /\ mnth valid init = true /\
  exists dom : nat -> Prop,
    dom init
    /\ (forall s, dom s -> s < n /\ mnth valid s = true)
    /\ (reach = false -> forall s, s < n -> mnth valid s = true -> dom s)
    /\ (forall e s, e < nevents apply -> dom s -> dom (nstep apply nf e s))
    /\ (forall a b, checked pairs (nevents apply) a b -> a < nevents apply /\ b < nevents apply)
    /\ (forall a b s, checked pairs (nevents apply) a b -> dom s ->
          nstep apply nf b (nstep apply nf a s) = nstep apply nf a (nstep apply nf b s)).
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
  destruct (cc1_loop PV (tmap (fun st => vgather st (mwhere dm)) PV) (vgather V (mwhere dm)) ps) eqn:Hloop;
    cbn [v_certified v_nf]; [discriminate|].
  intros _.
  destruct (nf_facts valid repair apply pairs init WF true F D HN eq_refl) as [Hwfc Hnf].
  destruct (dom_ok_spec valid repair apply pairs init WF F Hnf P HP dm (vnth P init) Hdom) as (Hl & Hi & Hcl).
  pose proof (wf_parts valid repair apply pairs init WF) as (Hin & _ & _ & _ & _ & Hps).
  pose proof (P_lt valid repair apply pairs init WF F Hnf P HP) as HPl.
  pose proof (PV_val valid repair apply pairs init WF F Hnf P HP) as HPV.
  pose proof (PV_two valid repair apply pairs init WF F Hnf P HP) as HP2.
  pose proof (V_facts valid repair apply pairs init WF F Hnf P HP) as HVf.
  assert (Hchk : forall a b, checked pairs (nevents apply) a b -> In (a, b) ps /\ a < nevents apply /\ b < nevents apply).
  { intros a b. unfold checked, ps. destruct pairs as [l|].
    - intros H. destruct (Hps l eq_refl a b H) as (H1 & H2 & _). auto.
    - rewrite in_all_pairs, tlen_length. intros H. unfold nevents in *. repeat split; lia. }
  split; [exact Hwfc|]. split; [exact Hnf|]. split; [reflexivity|].
  exists (fun s => exists j, j < vlen V /\ mnth dm j = true /\ s = vnth V j).
  destruct (HPl init Hin Hinit) as [Hpi Epi].
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
  split; [intros a b H; apply Hchk; auto|].
  intros a b s H [j (Hj & Hd & ->)]. destruct (Hchk a b H) as (Hab & Ha & Hb).
  destruct (HP2 a b j Ha Hb Hj) as [_ E1]. destruct (HP2 b a j Hb Ha Hj) as [_ E2].
  etransitivity; [exact E1|]. etransitivity; [|symmetry; exact E2]. f_equal.
  apply (cc1_loop_spec valid repair apply pairs init WF F Hnf P HP dm (vgather V (mwhere dm)) ps); auto.
  intros x y Hxy. unfold ps in Hxy. destruct pairs as [l|].
  - destruct (Hps l eq_refl x y Hxy) as (H1 & H2 & _). auto.
  - rewrite in_all_pairs, tlen_length in Hxy. unfold nevents. lia.
Qed.

(** ** Trace equivalence (eager compensation) *)

(** Two event sequences are trace-equivalent when one is obtained from the other by swapping
    adjacent events of checked pairs, any number of times. *)
Inductive swap (chk : nat -> nat -> Prop) : list nat -> list nat -> Prop :=
| swap_at u w a b : chk a b -> swap chk (u ++ a :: b :: w) (u ++ b :: a :: w).

Definition tequiv (chk : nat -> nat -> Prop) : list nat -> list nat -> Prop :=
  clos_refl_sym_trans (list nat) (swap chk).

Lemma run_app apply nf u w s : run apply nf (u ++ w) s = run apply nf w (run apply nf u s).
Proof. revert s; induction u; intros s; simpl; auto. Qed.

Lemma swap_forall chk (P : nat -> Prop) l1 l2 : swap chk l1 l2 -> (Forall P l1 <-> Forall P l2).
Proof.
  intros [u w a b _]. rewrite !Forall_app, !Forall_cons_iff. tauto.
Qed.

Lemma tequiv_forall chk (P : nat -> Prop) l1 l2 : tequiv chk l1 l2 -> (Forall P l1 <-> Forall P l2).
Proof.
  induction 1 as [x y H| | | x y z _ IH1 _ IH2]; try tauto.
  apply swap_forall with (chk := chk); auto.
Qed.

(** Generic form: on a set of states closed under the steps of the listed events, where
    every checked pair commutes, trace-equivalent sequences reach the same state. *)
Lemma tequiv_run (step : nat -> nat -> nat) (dom : nat -> Prop) (ok : nat -> Prop) (chk : nat -> nat -> Prop) :
  (forall e s, ok e -> dom s -> dom (step e s)) ->
  (forall a b s, chk a b -> dom s -> step b (step a s) = step a (step b s)) ->
  forall l1 l2, tequiv chk l1 l2 -> Forall ok l1 ->
  forall s, dom s -> fold_left (fun s e => step e s) l1 s = fold_left (fun s e => step e s) l2 s.
Proof.
  intros Hcl Hcc l1 l2 H.
  assert (Hrun : forall u s, Forall ok u -> dom s -> dom (fold_left (fun s e => step e s) u s)).
  { induction u as [|e u IH]; intros s Hu Hs; simpl; auto. inversion Hu; subst. apply IH; auto. }
  induction H as [x y Hs| x | x y Hxy IH | x y z Hxy IH1 Hyz IH2]; intros Hok s Hd.
  - destruct Hs as [u w a b Hab]. rewrite !fold_left_app. simpl.
    rewrite Forall_app in Hok. f_equal. apply Hcc; auto. apply Hrun; tauto.
  - reflexivity.
  - symmetry. apply IH; auto. apply (proj2 (tequiv_forall chk ok x y Hxy)); auto.
  - rewrite IH1 by auto. apply IH2; auto. apply (proj1 (tequiv_forall chk ok x y Hxy)); auto.
Qed.

Lemma run_fold apply nf es s : run apply nf es s = fold_left (fun s e => nstep apply nf e s) es s.
Proof. revert s; induction es; intros s; simpl; auto. Qed.

(** A certified verdict gives trace equivalence of normalized runs: from the initial state,
    from every state reachable from it, and (domain "valid") from every valid state. *)
Theorem check_tables_trace valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_certified v = true ->
  forall s, (exists u, Forall (fun e => e < nevents apply) u /\ s = run apply (v_nf v) u init)
            \/ (reach = false /\ s < mlen valid /\ mnth valid s = true) ->
  forall es1 es2, tequiv (checked pairs (nevents apply)) es1 es2 ->
  Forall (fun e => e < nevents apply) es1 ->
  run apply (v_nf v) es1 s = run apply (v_nf v) es2 s.
Proof.
  intros v Hc s Hs es1 es2 Heq Hok.
  destruct (check_tables_sound valid repair apply pairs reach init Hc)
    as (_ & _ & _ & dom & Hi & Hsub & Hval & Hcl & Hrange & Hcc).
  assert (Hd : dom s).
  { destruct Hs as [[u [Hu ->]]|(Hr & Hs & Hv)]; [|apply Hval; auto].
    rewrite run_fold. clear Heq Hok. revert Hu. generalize init Hi. induction u as [|e u IH]; intros x Hx Hu; simpl; auto.
    inversion Hu; subst. apply IH; auto. }
  rewrite !run_fold.
  apply tequiv_run with (dom := dom) (ok := fun e => e < nevents apply) (chk := checked pairs (nevents apply)); auto.
Qed.

(** ** Rejections for CC1 come with a proven witness *)

Lemma first_false_lt l : forallb (fun b : bool => b) l = false -> first_false l < length l.
Proof. induction l as [|b l IH]; simpl; [discriminate|]. destruct b; simpl; [intros H; specialize (IH H); lia|lia]. Qed.

Lemma mfirst_false_spec m : mall m = false -> mfirst_false m < mlen m /\ mnth m (mfirst_false m) = false.
Proof.
  unfold mall, mfirst_false, mlen, mnth. intros H. apply first_false_lt in H. split; auto.
  rewrite nth_indep with (d' := true) by auto. apply first_false_spec. auto.
Qed.

Section Witness.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).
Hypothesis WF : well_formed valid repair apply pairs init = true.
Variable F : vec.
Hypothesis HF : IsNF valid repair F.
Variable P : vec.
Hypothesis HP : pos_ok P (mwhere valid) = true.
Let PV := tmap (fun xv => vgather P xv) (tmap (fun a => vgather F (vgather a (mwhere valid))) apply).

Lemma cc1_loop_witness dm ps a b s :
  mlen dm = vlen (mwhere valid) ->
  (forall x y, In (x, y) ps -> x < nevents apply /\ y < nevents apply) ->
  cc1_loop PV (tmap (fun st => vgather st (mwhere dm)) PV) (vgather (mwhere valid) (mwhere dm)) ps = Some (a, b, s) ->
  In (a, b) ps /\ exists j, j < vlen (mwhere valid) /\ mnth dm j = true /\ s = vnth (mwhere valid) j
  /\ vnth (nth b PV dflt) (vnth (nth a PV dflt) j) <> vnth (nth a PV dflt) (vnth (nth b PV dflt) j).
Proof using WF HF HP.
  intros Hl Hr Hloop.
  set (didx := mwhere dm) in *.
  set (PVD := tmap (fun st => vgather st didx) PV) in *.
  assert (HPVl : length PV = nevents apply).
  { unfold PV. rewrite !tmap_map, !map_length. reflexivity. }
  assert (HD : forall e, e < nevents apply -> nth e PVD dflt = vgather (nth e PV dflt) didx).
  { intros e He. unfold PVD. rewrite tmap_map. rewrite (nth_map_lt _ _ _ _ dflt); [reflexivity|].
    rewrite HPVl. auto. }
  assert (Hlen : forall e, e < nevents apply -> vlen (nth e PVD dflt) = vlen didx).
  { intros e He. rewrite HD, vlen_vgather; auto. }
  induction ps as [|[x y] ps IH]; simpl in Hloop; [discriminate|].
  destruct (Hr x y (or_introl eq_refl)) as [Hx Hy].
  destruct (vgeq (nth y PV dflt) (nth x PVD dflt) (nth x PV dflt) (nth y PVD dflt)) eqn:Hok.
  - destruct IH as (H1 & H2); auto.
    + intros u w H. apply Hr. simpl. auto.
    + split; [simpl; auto|exact H2].
  - injection Hloop as <- <- <-.
    set (ok := veq (vgather (nth y PV dflt) (nth x PVD dflt)) (vgather (nth x PV dflt) (nth y PVD dflt))) in *.
    assert (Hokl : mlen ok = vlen didx).
    { unfold ok. rewrite mlen_veq; rewrite !vlen_vgather, ?Hlen; auto. }
    assert (Hall : mall ok = false) by exact Hok.
    destruct (mfirst_false_spec ok Hall) as [Hk Hv]. rewrite Hokl in Hk.
    set (k := mfirst_false ok) in *.
    destruct (vnth_mwhere dm k Hk) as [Hj Hd]. fold didx in Hj, Hd.
    split; [simpl; auto|].
    exists (vnth didx k). split; [rewrite <- Hl; exact Hj|]. split; [exact Hd|]. split.
    + rewrite vnth_vgather by auto. reflexivity.
    + unfold ok in Hv. rewrite mnth_veq in Hv by (rewrite ?vlen_vgather, ?Hlen; auto).
      apply Nat.eqb_neq in Hv. rewrite !vnth_vgather in Hv by (rewrite ?Hlen; auto).
      rewrite !HD in Hv by auto. rewrite !vnth_vgather in Hv by auto. exact Hv.
Qed.

End Witness.

(** A rejection for CC1 names a checked pair and a valid state of the checked domain from which the
    two orders of that pair reach different states. *)
Theorem check_tables_witness valid repair apply pairs reach init a b s :
  let v := check_tables valid repair apply pairs reach init in
  v_witness v = Some (a, b, s) ->
  checked pairs (nevents apply) a b /\ s < mlen valid /\ mnth valid s = true
  /\ nstep apply (v_nf v) b (nstep apply (v_nf v) a s) <> nstep apply (v_nf v) a (nstep apply (v_nf v) b s).
Proof.
  cbv zeta. unfold check_tables, check_from_nf.
  destruct (well_formed valid repair apply pairs init) eqn:WF; cbn [negb v_witness]; [|discriminate].
  destruct (nf_result valid repair) as [[wfc F] D] eqn:HN.
  destruct wfc; cbn [negb v_witness]; [|discriminate].
  destruct (pos_ok (vrank valid) (mwhere valid)) eqn:HP; cbn [negb v_witness]; [|discriminate].
  destruct (mnth valid init) eqn:Hinit; cbn [negb v_witness]; [|discriminate].
  set (V := mwhere valid) in *.
  set (P := vrank valid) in *.
  set (XV := tmap (fun a => vgather F (vgather a V)) apply) in *.
  set (PV := tmap (fun xv => vgather P xv) XV) in *.
  set (dm := domain_mask (vlen V) PV reach (vnth P init)) in *.
  destruct (dom_ok (vlen V) PV dm (vnth P init)) eqn:Hdom; cbn [negb v_witness v_nf]; [|discriminate].
  set (ps := match pairs with None => all_pairs (tlen apply) | Some ps => ps end) in *.
  intros Hw.
  destruct (nf_facts valid repair apply pairs init WF true F D HN eq_refl) as [_ Hnf].
  destruct (dom_ok_spec valid repair apply pairs init WF F Hnf P HP dm (vnth P init) Hdom) as (Hl & _ & _).
  pose proof (wf_parts valid repair apply pairs init WF) as (_ & _ & _ & _ & _ & Hps).
  assert (Hr : forall x y, In (x, y) ps -> x < nevents apply /\ y < nevents apply).
  { intros x y Hxy. unfold ps in Hxy. destruct pairs as [l|].
    - destruct (Hps l eq_refl x y Hxy) as (H1 & H2 & _). auto.
    - rewrite in_all_pairs, tlen_length in Hxy. unfold nevents. lia. }
  destruct (cc1_loop_witness valid repair apply pairs init WF F Hnf P HP dm ps a b s Hl Hr Hw)
    as (Hin & j & Hj & Hd & -> & Hne).
  assert (Hab : a < nevents apply /\ b < nevents apply) by (apply Hr; auto).
  destruct Hab as [Ha Hb].
  destruct (V_facts valid repair apply pairs init WF F Hnf P HP j Hj) as [Hs Hv].
  split; [|split; [exact Hs|split; [exact Hv|]]].
  - unfold checked. unfold ps in Hin. destruct pairs as [l|]; auto.
    rewrite in_all_pairs, tlen_length in Hin. exact Hin.
  - destruct (PV_two valid repair apply pairs init WF F Hnf P HP a b j Ha Hb Hj) as [H1 E1].
    destruct (PV_two valid repair apply pairs init WF F Hnf P HP b a j Hb Ha Hj) as [H2 E2].
    rewrite E1, E2. intros E. apply Hne.
    apply (V_inj valid repair apply pairs init WF F Hnf P HP); auto.
Qed.

(** ** Rejections for WFC are proven: a repair cycle exists *)

Lemma bounded_dec (P : nat -> Prop) (Pd : forall i, {P i} + {~ P i}) m :
  (exists i, i < m /\ P i) \/ (forall i, i < m -> ~ P i).
Proof.
  induction m as [|m IH]; [right; intros; lia|].
  destruct IH as [[i [Hi Pi]]|H]; [left; exists i; split; [lia|auto]|].
  destruct (Pd m) as [Pm|Pm]; [left; exists m; split; [lia|auto]|].
  right. intros i Hi. destruct (Nat.eq_dec i m) as [->|Hne]; auto. apply H; lia.
Qed.

(** Pigeonhole: m > n values below n contain a repeat. *)
Lemma pigeon n : forall m (f : nat -> nat), (forall k, k < m -> f k < n) -> n < m ->
  exists i j, i < j < m /\ f i = f j.
Proof.
  induction n as [|n IH]; intros m f Hf Hm.
  - specialize (Hf 0 ltac:(lia)). lia.
  - destruct m as [|m]; [lia|].
    destruct (bounded_dec (fun i => f i = f m) (fun i => Nat.eq_dec (f i) (f m)) m) as [[i [Hi Ei]]|Hno].
    { exists i, m. split; [lia|auto]. }
    set (g := fun k => if Nat.ltb (f k) (f m) then f k else f k - 1).
    destruct (IH m g) as [i [j [Hij Eg]]].
    + intros k Hk. unfold g. cbv beta. specialize (Hf k ltac:(lia)) as Hfk. specialize (Hno k Hk).
      assert (Hfm : f m < S n) by (apply Hf; lia).
      destruct (Nat.ltb_spec (f k) (f m)); lia.
    + lia.
    + exists i, j. split; [lia|]. unfold g in Eg. cbv beta in Eg.
      assert (Ni := Hno i ltac:(lia)). assert (Nj := Hno j ltac:(lia)). simpl in Ni, Nj.
      revert Eg. destruct (Nat.ltb_spec (f i) (f m)); destruct (Nat.ltb_spec (f j) (f m)); intros Eg; lia.
Qed.

Section WfcComplete.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).
Hypothesis WF : well_formed valid repair apply pairs init = true.
Let n := mlen valid.

Lemma nf_loop_false fuel : forall m F D F' D', inv valid repair m F D ->
  nf_loop fuel valid F D = (false, F', D') ->
  inv valid repair (m * 2 ^ fuel) F' D' /\ exists s, s < n /\ mnth valid (vnth F' s) = false.
Proof.
  induction fuel as [|k IH]; intros m F D F' D' Hinv Hl; simpl in Hl.
  - destruct (mallat valid F) eqn:Ha; [discriminate|]. unfold mallat in Ha. injection Hl as <- <-.
    rewrite Nat.mul_1_r. split; [exact Hinv|].
    destruct Hinv as (HF & _ & _).
    destruct (mfirst_false_spec _ Ha) as [Hj Hv]. rewrite mlen_mgather in Hj.
    exists (mfirst_false (mgather valid F)). split; [fold n in HF; congruence|].
    rewrite mnth_mgather in Hv by auto. exact Hv.
  - destruct (mallat valid F) eqn:Ha; [discriminate|]. unfold mallat in Ha.
    destruct (IH (m + m) _ _ _ _ (inv_double valid repair apply pairs init WF m F D Hinv) Hl) as [H1 H2].
    split; [|exact H2]. replace (m * 2 ^ S k) with ((m + m) * 2 ^ k) by (simpl; lia). exact H1.
Qed.

Lemma cycle_of_invalid M s : n < M -> s < n -> mnth valid (iter repair M s) = false ->
  forall k, mnth valid (iter repair k s) = false.
Proof.
  intros HM Hs HMv.
  assert (Hle : forall k, k <= M -> mnth valid (iter repair k s) = false).
  { intros k Hk. destruct (mnth valid (iter repair k s)) eqn:E; auto.
    replace M with (k + (M - k)) in HMv by lia. rewrite iter_add in HMv.
    rewrite (iter_valid valid repair apply pairs init WF) in HMv; auto; [congruence|].
    apply (iter_lt valid repair apply pairs init WF); auto. }
  destruct (pigeon n (S n) (fun k => iter repair k s)) as [i [j [Hij Eij]]].
  { intros k Hk. apply (iter_lt valid repair apply pairs init WF); auto. }
  { lia. }
  intros k. induction k as [k IHk] using lt_wf_ind.
  destruct (Nat.le_gt_cases k M) as [Hk|Hk]; [apply Hle; auto|].
  replace k with (j + (k - j)) by lia. rewrite iter_add, <- Eij, <- iter_add. apply IHk. lia.
Qed.

End WfcComplete.

(** A rejection for WFC is evidence: some state never reaches a valid state by repair. *)
Theorem check_tables_wfc_complete valid repair apply pairs reach init :
  let v := check_tables valid repair apply pairs reach init in
  v_wellformed v = true -> v_wfc v = false ->
  exists s, s < mlen valid /\ forall k, mnth valid (iter repair k s) = false.
Proof.
  simpl. unfold check_tables, check_from_nf.
  destruct (well_formed valid repair apply pairs init) eqn:WF; simpl; [|discriminate].
  destruct (nf_result valid repair) as [[wfc F] D] eqn:HN.
  destruct wfc; cbn [negb v_wellformed v_wfc].
  { repeat match goal with |- context [if ?c then _ else _] => destruct c end;
      cbn [v_wellformed v_wfc]; intros H1 H2; discriminate. }
  intros _ _. unfold nf_result in HN.
  destruct (nf_loop_false valid repair apply pairs init WF _ 1 _ _ _ _
              (inv_init valid repair apply pairs init WF) HN) as [(HF & _ & Hinv) [s [Hs Hv]]].
  exists s. split; [exact Hs|].
  destruct (Hinv s Hs) as [E _]. rewrite E in Hv.
  apply (cycle_of_invalid valid repair apply pairs init WF (1 * 2 ^ S (Nat.log2 (mlen valid)))); auto.
  destruct (Nat.log2_spec (mlen valid)) as [_ Hlt]; [lia|]. simpl in *. lia.
Qed.

(** ** The checker with a witness

    The engine computes, with the tables, the repair depth of every state and the normal
    forms.  [check_tables_w] takes both as an UNTRUSTED witness and checks them in one pass
    each, instead of pointer doubling: [Dw] is 0 exactly on valid states, [Dw s] is
    [Dw (repair s) + 1] on invalid ones, and below [n] (so repair terminates: a ranking);
    [Fw] is constant along repair and the identity on valid states.  The two checks over
    every state are one fused primitive, [vstepok].  A witness that fails the
    check gives the malformed verdict (no verdict); one that passes gives exactly the verdict
    of [check_tables] ([check_tables_w_eq]), so every theorem about [check_tables] holds for
    [check_tables_w]'s verdict. *)
Definition witness_ok (valid : mask) (repair Fw Dw : vec) : bool :=
  let n := mlen valid in
  let V := mwhere valid in
  Nat.eqb (vlen Fw) n && Nat.eqb (vlen Dw) n && Nat.ltb (vmax Dw) n
  && Nat.eqb (vmax (vgather Dw V)) 0
  && vstepok valid repair Fw Dw
  && mall (veq (vgather Fw V) V).

Definition check_tables_w (valid : mask) (repair : vec) (apply : list vec)
    (pairs : option (list (nat * nat))) (reach : bool) (init : nat) (Fw Dw : vec) : verdict :=
  if negb (well_formed valid repair apply pairs init && witness_ok valid repair Fw Dw)
  then Verdict false false false 0 false false false None false repair 0 [] [] else
  check_from_nf valid apply pairs reach init true Fw Dw.

Lemma vec_ext a b : vlen a = vlen b -> (forall i, i < vlen a -> vnth a i = vnth b i) -> a = b.
Proof.
  destruct a as [a], b as [b]. unfold vlen, vnth; simpl. intros Hl H. f_equal.
  apply nth_ext with (d := 0) (d' := 0); auto.
Qed.

Section Witness.
Variables (valid : mask) (repair : vec) (apply : list vec) (pairs : option (list (nat * nat))) (init : nat).
Hypothesis WF : well_formed valid repair apply pairs init = true.
Variables (Fw Dw : vec).
Hypothesis WOK : witness_ok valid repair Fw Dw = true.
Let n := mlen valid.

Lemma mall_veq_nth a b i : mall (veq a b) = true -> vlen a = vlen b -> i < vlen a -> vnth a i = vnth b i.
Proof.
  intros H Hl Hi. rewrite mall_spec in H. rewrite mlen_veq in H by auto.
  specialize (H i Hi). rewrite mnth_veq in H by auto. apply Nat.eqb_eq. exact H.
Qed.

Lemma w_parts :
  vlen Fw = n /\ vlen Dw = n /\ vmax Dw < n
  /\ (forall s, s < n -> mnth valid s = true -> vnth Dw s = 0)
  /\ (forall s, s < n -> vnth Dw s = vnth Dw (rep repair s) + (if mnth valid s then 0 else 1))
  /\ (forall s, s < n -> vnth Fw s = vnth Fw (rep repair s))
  /\ (forall s, s < n -> mnth valid s = true -> vnth Fw s = s).
Proof using WF WOK.
  destruct (wf_parts valid repair apply pairs init WF) as (_ & Hrl & Hrm & _).
  fold n in Hrl, Hrm.
  unfold witness_ok, vstepok in WOK. fold n in WOK.
  repeat match goal with H : (_ && _) = true |- _ => apply andb_prop in H as [? ?] end.

  repeat match goal with
  | H : Nat.eqb _ _ = true |- _ => apply Nat.eqb_eq in H
  | H : Nat.ltb _ _ = true |- _ => apply Nat.ltb_lt in H
  end.
  match goal with H : vlen Fw = n |- _ => rename H into HFl end.
  match goal with H : vlen Dw = n |- _ => rename H into HDl end.
  match goal with H : vmax Dw < n |- _ => rename H into HDm end.
  match goal with H : vmax (vgather Dw _) = 0 |- _ => rename H into HD0 end.
  match goal with H : mall (veq Dw _) = true |- _ => rename H into HDs end.
  match goal with H : mall (veq Fw _) = true |- _ => rename H into HFs end.
  match goal with H : mall (veq (vgather Fw _) _) = true |- _ => rename H into HFv end.
  split; [auto|]. split; [auto|]. split; [auto|]. split; [|split; [|split]].
  - intros s Hs Hv. destruct (mwhere_cover valid s Hs Hv) as [j [Hj Ej]].
    pose proof (vmax_ge (vgather Dw (mwhere valid)) j) as G.
    rewrite vlen_vgather, vnth_vgather, Ej in G by auto. specialize (G Hj). lia.
  - intros s Hs.
    assert (Hg : vlen (vgather Dw repair) = n) by (rewrite vlen_vgather; auto).
    assert (Hn : vlen (vnotbit valid) = n) by (rewrite vlen_vnotbit; auto).
    assert (Ha : vlen (vadd (vgather Dw repair) (vnotbit valid)) = n) by (rewrite vlen_vadd; lia).
    rewrite (mall_veq_nth _ _ s HDs) by lia.
    rewrite vnth_vadd by lia. rewrite vnth_vgather, vnth_vnotbit by lia. reflexivity.
  - intros s Hs. rewrite (mall_veq_nth _ _ s HFs) by (rewrite ?vlen_vgather; lia).
    rewrite vnth_vgather by lia. reflexivity.
  - intros s Hs Hv. destruct (mwhere_cover valid s Hs Hv) as [j [Hj Ej]].
    pose proof (mall_veq_nth _ _ j HFv) as G. rewrite vlen_vgather in G.
    specialize (G eq_refl Hj). rewrite vnth_vgather, Ej in G by auto. exact G.
Qed.

Let d s := vnth Dw s.

Lemma d_zero s : s < n -> d s = 0 -> mnth valid s = true.
Proof using WF WOK.
  intros Hs H. destruct w_parts as (_ & _ & _ & _ & HD & _). specialize (HD s Hs).
  unfold d in H. destruct (mnth valid s); auto. lia.
Qed.

Lemma d_iter k s : s < n -> k <= d s -> d (iter repair k s) = d s - k.
Proof using WF WOK.
  revert s; induction k as [|k IH]; intros s Hs Hk; simpl; [lia|].
  destruct w_parts as (_ & _ & _ & HV & HD & _).
  destruct (mnth valid s) eqn:Hv.
  - unfold d in Hk. rewrite HV in Hk by auto. lia.
  - pose proof (HD s Hs) as E. rewrite Hv in E. unfold d in *.
    rewrite IH; [lia|apply (rep_lt valid repair apply pairs init WF); auto|lia].
Qed.

Lemma iter_d_valid s : s < n -> mnth valid (iter repair (d s) s) = true.
Proof using WF WOK.
  intros Hs. apply d_zero; [apply (iter_lt valid repair apply pairs init WF); auto|].
  rewrite d_iter; auto. lia.
Qed.

Lemma iter_ge_valid k s : s < n -> d s <= k -> mnth valid (iter repair k s) = true.
Proof using WF WOK.
  intros Hs Hk. replace k with (d s + (k - d s)) by lia. rewrite iter_add.
  rewrite (iter_valid valid repair apply pairs init WF); [apply iter_d_valid; auto| |apply iter_d_valid; auto].
  apply (iter_lt valid repair apply pairs init WF); auto.
Qed.

Lemma iter_lt_d_invalid k s : s < n -> k < d s -> mnth valid (iter repair k s) = false.
Proof using WF WOK.
  intros Hs Hk. destruct (mnth valid (iter repair k s)) eqn:Hv; auto.
  destruct w_parts as (_ & _ & _ & HV & _).
  pose proof (d_iter k s Hs ltac:(lia)) as E. unfold d in E, Hk.
  rewrite HV in E by (auto; apply (iter_lt valid repair apply pairs init WF); auto). lia.
Qed.

Lemma Fw_iter k s : s < n -> vnth Fw (iter repair k s) = vnth Fw s.
Proof using WF WOK.
  revert s; induction k as [|k IH]; intros s Hs; simpl; auto.
  destruct w_parts as (_ & _ & _ & _ & _ & HF & _).
  rewrite IH by (apply (rep_lt valid repair apply pairs init WF); auto). symmetry. apply HF; auto.
Qed.

Lemma Fw_is s : s < n -> vnth Fw s = iter repair (d s) s.
Proof using WF WOK.
  intros Hs. destruct w_parts as (_ & _ & _ & _ & _ & _ & HFv).
  rewrite <- (Fw_iter (d s) s Hs). apply HFv; [apply (iter_lt valid repair apply pairs init WF); auto|].
  apply iter_d_valid; auto.
Qed.

Lemma cnt_d k s : s < n -> k <= d s -> cnt valid repair k s = k.
Proof using WF WOK.
  revert s; induction k as [|k IH]; intros s Hs Hk; simpl; auto.
  destruct w_parts as (_ & _ & _ & HV & HD & _).
  destruct (mnth valid s) eqn:Hv.
  - unfold d in Hk. rewrite HV in Hk by auto. lia.
  - pose proof (HD s Hs) as E. rewrite Hv in E. unfold d in *.
    rewrite IH; [lia|apply (rep_lt valid repair apply pairs init WF); auto|lia].
Qed.

Lemma at_m m s : s < n -> mnth valid (iter repair m s) = true ->
  iter repair m s = vnth Fw s /\ cnt valid repair m s = vnth Dw s.
Proof using WF WOK.
  intros Hs Hv.
  assert (Hm : d s <= m).
  { destruct (Nat.le_gt_cases (d s) m) as [H|H]; auto.
    rewrite iter_lt_d_invalid in Hv by auto. discriminate. }
  assert (Hvd := iter_d_valid s Hs).
  assert (Hl := iter_lt valid repair apply pairs init WF (d s) s Hs).
  replace m with (d s + (m - d s)) by lia.
  rewrite iter_add, cnt_add.
  rewrite (iter_valid valid repair apply pairs init WF _ (iter repair (d s) s)) by auto.
  rewrite (cnt_valid valid repair apply pairs init WF _ (iter repair (d s) s)) by auto.
  rewrite (Fw_is s Hs), (cnt_d (d s) s Hs (le_n _)). unfold d. split; [reflexivity|lia].
Qed.

Lemma nf_loop_w fuel : forall m F D, inv valid repair m F D ->
  (forall s, s < n -> d s <= m * 2 ^ fuel) -> nf_loop fuel valid F D = (true, Fw, Dw).
Proof using WF WOK.
  induction fuel as [|k IH]; intros m F D Hinv Hb; simpl.
  all: destruct Hinv as (HF & HD & Hi); fold n in HF, HD, Hi.
  all: destruct w_parts as (HFl & HDl & _).
  all: destruct (mallat valid F) eqn:Ha.
  - assert (Hv : forall s, s < n -> mnth valid (iter repair m s) = true).
    { intros s Hs. apply iter_ge_valid; auto. specialize (Hb s Hs). rewrite Nat.pow_0_r in Hb. lia. }
    assert (E : F = Fw /\ D = Dw).
    { split; apply vec_ext; try lia; intros s Hs; [rewrite HF in Hs|rewrite HD in Hs];
        destruct (Hi s Hs) as [E1 E2]; destruct (at_m m s Hs (Hv s Hs)); congruence. }
    destruct E as [-> ->]. reflexivity.
  - exfalso. unfold mallat in Ha. apply Bool.not_true_iff_false in Ha. apply Ha.
    apply mall_spec. rewrite mlen_mgather. intros s Hs. rewrite mnth_mgather by auto.
    rewrite HF in Hs. destruct (Hi s Hs) as [E1 _]. rewrite E1.
    apply iter_ge_valid; auto. specialize (Hb s Hs). rewrite Nat.pow_0_r in Hb. lia.
  - assert (Hv : forall s, s < n -> mnth valid (iter repair m s) = true).
    { intros s Hs. destruct (Hi s Hs) as [E1 _]. rewrite <- E1.
      unfold mallat in Ha; rewrite mall_spec, mlen_mgather in Ha; specialize (Ha s ltac:(lia)).
      rewrite mnth_mgather in Ha by lia; exact Ha. }
    assert (E : F = Fw /\ D = Dw).
    { split; apply vec_ext; try lia; intros s Hs; [rewrite HF in Hs|rewrite HD in Hs];
        destruct (Hi s Hs) as [E1 E2]; destruct (at_m m s Hs (Hv s Hs)); congruence. }
    destruct E as [-> ->]. reflexivity.
  - apply (IH (m + m)).
    + apply (inv_double valid repair apply pairs init WF). split; auto.
    + intros s Hs. specialize (Hb s Hs). rewrite Nat.pow_succ_r' in Hb. lia.
Qed.

Lemma nf_result_w : nf_result valid repair = (true, Fw, Dw).
Proof using WF WOK.
  unfold nf_result. apply (nf_loop_w _ 1); [apply (inv_init valid repair apply pairs init WF)|].
  intros s Hs. destruct w_parts as (_ & HDl & HDm & _).
  pose proof (vmax_ge Dw s ltac:(lia)) as G.
  destruct (Nat.log2_spec n) as [_ Hlt]; [lia|]. fold n. unfold d. lia.
Qed.

End Witness.

(** A witness that passes the check changes nothing: the verdict is [check_tables]'s. *)
Theorem check_tables_w_eq valid repair apply pairs reach init Fw Dw :
  witness_ok valid repair Fw Dw = true ->
  check_tables_w valid repair apply pairs reach init Fw Dw = check_tables valid repair apply pairs reach init.
Proof.
  intros WOK. unfold check_tables_w, check_tables.
  destruct (well_formed valid repair apply pairs init) eqn:WF; [|reflexivity].
  rewrite WOK. cbn [andb negb].
  rewrite (nf_result_w valid repair apply pairs init WF Fw Dw WOK). reflexivity.
Qed.

(** A witness that fails the check gives no verdict. *)
Theorem check_tables_w_malformed valid repair apply pairs reach init Fw Dw :
  witness_ok valid repair Fw Dw = false ->
  v_wellformed (check_tables_w valid repair apply pairs reach init Fw Dw) = false.
Proof.
  intros H. unfold check_tables_w. rewrite H, andb_false_r. reflexivity.
Qed.
